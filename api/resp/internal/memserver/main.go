// Command memserver serves an in-memory store (resptest.MemStore) over
// RESP, for trying Redis clients against the RESP server alone and for
// bench/resp-vs-redis.sh:
//
//	go run ./api/resp/internal/memserver -addr 127.0.0.1:6390
//
// It runs until interrupted.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6390", "TCP address to serve")
	maxValue := flag.Int64("max-value", 0, "largest value accepted, in bytes (0: no limit)")
	capacity := flag.Int64("capacity", 0, "most bytes of values held (0: no limit)")
	maxBulk := flag.Int64("max-bulk-len", 0, "longest bulk string a client may send (0: the default)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "memserver:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*addr, *maxValue, *capacity, *maxBulk); err != nil {
		fmt.Fprintln(os.Stderr, "memserver:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(addr string, maxValue, capacity, maxBulk int64) error {
	store := resptest.NewMemStore()
	store.MaxValue, store.Capacity = maxValue, capacity
	srv, err := resp.NewServer(store, &resp.Config{MaxBulkLen: maxBulk})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "memserver: serving RESP on", ln.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, resp.ErrServerClosed) {
		return err
	}
	return nil
}
