//go:build ucx

package ucx

import "strings"

// Describe says what the listener's endpoints use underneath, for kvctl
// stats and the logs: its UCX settings, the lanes of its connected
// endpoints ("posix/memory(am,am_bw,keepalive)", or "no peers yet"), and
// how blocks in GPU memory travel: by UCX itself where its build has CUDA
// support (sent from and received into device memory), else staged through
// pinned host memory.
func (l *listener) Describe() string {
	lanes := FormatLanes(l.Lanes())
	if lanes == "" {
		lanes = "no peers yet"
	}
	lanes += "; " + DeviceMemoryDetail(l.w.cuda)
	var kv []string
	for _, s := range l.opts.settings() {
		kv = append(kv, s[0]+"="+s[1])
	}
	settings := strings.Join(kv, " ")
	if settings == "" {
		return lanes
	}
	return lanes + "; " + settings
}

// DeviceMemoryDetail says how GPU-memory blocks travel, for Describe.
func DeviceMemoryDetail(cuda bool) string {
	if cuda {
		return "device memory: by UCX (cuda)"
	}
	return "device memory: staged through pinned host memory (this UCX has no CUDA support)"
}
