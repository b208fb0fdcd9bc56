//go:build ucx && cuda

package dataplane

import (
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/transfer/ucx"
)

// Blocks held in a node's HBM tier reach a client's GPU memory over UCX:
// straight from and into device memory where UCX has CUDA support, else
// (Debian's UCX, and this stand-in driver's "device memory", which UCX
// would not know for CUDA memory anyway) staged through pinned host memory
// on both sides.
func TestHBMBlocksReachDeviceMemoryOverUCX(t *testing.T) {
	tr := ucx.New(ucx.Options{})
	testDeviceGets(t, tr, true)
}

// The listener says how blocks in GPU memory travel.
func TestHBMUCXListenerSaysHowDeviceMemoryTravels(t *testing.T) {
	setupCUDA(t)
	hn := newHBMNode(t)
	l, err := ucx.New(ucx.Options{}).Listen("127.0.0.1:0", hn.h)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := l.(interface{ Describe() string }).Describe()
	t.Log(d)
	if !strings.Contains(d, "device memory: by UCX (cuda)") && !strings.Contains(d, "device memory: staged through pinned host memory") {
		t.Fatalf("Describe() = %q: it does not say how device memory travels", d)
	}
}
