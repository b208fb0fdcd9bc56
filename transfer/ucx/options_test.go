//go:build ucx

package ucx_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/transfer/transfertest"
	"github.com/kvstrata/kvstrata/transfer/ucx"
)

func TestZeroOptionsAreTheDefaults(t *testing.T) {
	var o ucx.Options
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if o.MaxBlockSize != 4<<20 || o.MaxBlocks != 1024 || o.MaxConns != 1024 || o.ChunkSize != ucx.DefaultChunkSize {
		t.Errorf("defaults = %+v, want 4 MiB blocks, 1024 blocks a request, 1024 connections", o)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	o := ucx.Options{
		TLS: "posix,,cma", NetDevices: "eth0 lo", Settings: map[string]string{"UCX_TLS": "tcp", "NET_DEVICES": "lo"},
		MaxBlockSize: 2 << 30, MaxBlocks: -1, MaxConns: -5, ChunkSize: 100, BusyPoll: 2 * time.Second,
		IdleTimeout: -time.Second,
	}
	o.EnsureDefaults()
	err := o.Validate()
	if !errors.Is(err, ucx.ErrInvalidOptions) {
		t.Fatalf("Validate = %v, want ErrInvalidOptions", err)
	}
	for _, field := range []string{"TLS", "NetDevices", `"UCX_TLS"`, "set NET_DEVICES through", "MaxBlockSize",
		"MaxBlocks", "MaxConns", "ChunkSize", "BusyPoll", "IdleTimeout"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("%q does not name %s", err, field)
		}
	}
}

func TestSettingsSayWhatTheTransportSets(t *testing.T) {
	got := strings.Join(ucx.New(ucx.Options{TLS: "posix,cma,self", NetDevices: "lo",
		Settings: map[string]string{"RNDV_THRESH": "16k"}}).Settings(), " ")
	want := "TLS=posix,cma,self NET_DEVICES=lo MM_ERROR_HANDLING=y RCACHE_ENABLE=n RNDV_THRESH=16k"
	if got != want {
		t.Errorf("Settings() = %q, want %q", got, want)
	}
	if got := strings.Join(ucx.New(ucx.Options{TLS: "tcp"}).Settings(), " "); strings.Contains(got, "MM_ERROR_HANDLING") {
		t.Errorf("Settings() for tcp = %q, want no shared-memory setting", got)
	}
}

func TestInvalidOptionsFailListenAndDial(t *testing.T) {
	tr := ucx.New(ucx.Options{MaxBlocks: -1})
	if _, err := tr.Listen("127.0.0.1:0", transfertest.NewMemory()); !errors.Is(err, ucx.ErrInvalidOptions) {
		t.Errorf("Listen = %v, want ErrInvalidOptions", err)
	}
	if _, err := tr.Dial(context.Background(), "127.0.0.1:1"); !errors.Is(err, ucx.ErrInvalidOptions) {
		t.Errorf("Dial = %v, want ErrInvalidOptions", err)
	}
}

func TestUCXRefusingASettingSaysWhichAndWhy(t *testing.T) {
	// (UCX takes unknown names and only warns about them when it makes
	// the worker; a value it cannot parse it refuses.)
	tr := ucx.New(ucx.Options{Settings: map[string]string{"RNDV_THRESH": "banana"}})
	_, err := tr.Listen("127.0.0.1:0", transfertest.NewMemory())
	if !errors.Is(err, ucx.ErrUCX) || !strings.Contains(err.Error(), `UCX_RNDV_THRESH="banana"`) {
		t.Fatalf("Listen with a bad UCX setting = %v, want ErrUCX naming it", err)
	}
	t.Log(err)
	_, err = ucx.New(ucx.Options{TLS: "no_such_transport"}).Listen("127.0.0.1:0", transfertest.NewMemory())
	if !errors.Is(err, ucx.ErrUCX) {
		t.Fatalf("Listen over a transport UCX lacks = %v, want ErrUCX", err)
	}
	t.Log(err)
}

func TestServerRefusesAnotherProtocolAndVersion(t *testing.T) {
	ln := transfertest.Listen(t, ucx.New(ucx.Options{TLS: "tcp"}), transfertest.NewMemory())
	for _, c := range []struct{ hello, want string }{
		{"KVST\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "not a kvstrata UCX data-plane hello"},
		{"KVUX\x09\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00abcd", "protocol version 9"},
	} {
		nc, err := net.Dial("tcp", ln.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Write([]byte(c.hello)); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1024)
		n, _ := nc.Read(b)
		if !strings.Contains(string(b[:n]), c.want) {
			t.Errorf("answer to %q = %q, want it to say %q", c.hello, b[:n], c.want)
		}
		_ = nc.Close()
	}
}

func TestLanesSayWhichTransportsMoveTheBytes(t *testing.T) {
	for _, c := range []struct{ tls, want string }{
		{"posix,cma,self", "posix/memory"},
		{"tcp", "tcp/"},
	} {
		tr := ucx.New(ucx.Options{TLS: c.tls})
		ln := transfertest.Listen(t, tr, transfertest.NewMemory())
		conn := transfertest.Dial(t, tr, ln.Addr())
		for _, r := range []ucx.LaneReporter{conn.(ucx.LaneReporter), ln.(ucx.LaneReporter)} {
			lanes := ucx.FormatLanes(r.Lanes())
			if !strings.Contains(lanes, c.want) || !strings.Contains(lanes, "am") {
				t.Errorf("TLS %s: lanes %q, want %s carrying messages", c.tls, lanes, c.want)
			}
			t.Logf("TLS %s: %T lanes %s", c.tls, r, lanes)
		}
	}
}

func TestGoPanicsSurviveUCXSignalHandlers(t *testing.T) {
	// libucs installs handlers for SIGSEGV and friends when it loads; a
	// nil dereference in Go must still be a recoverable Go panic.
	transfertest.Listen(t, ucx.New(ucx.Options{TLS: "posix,cma,self"}), transfertest.NewMemory())
	defer func() {
		if recover() == nil {
			t.Fatal("dereferencing nil did not panic")
		}
	}()
	var p *int
	_ = *p
}
