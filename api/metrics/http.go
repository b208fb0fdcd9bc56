package metrics

import (
	"context"
	"fmt"
	"net/http"
	httppprof "net/http/pprof"
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Check is one readiness check: nil when the part it checks is ready.
type Check struct {
	Name string
	Fn   func() error
	// Advisory checks are listed but do not make the node unready (a
	// tier that is down while the others serve).
	Advisory bool
}

// Handler serves /metrics, /healthz (the process is up) and /readyz (every
// check passes; the body lists each check's state either way), and with
// pprof Go's profiler under /debug/pprof/, with the mutex and block
// profiles on (one contention event in 100 sampled, blocking sampled about
// once per 100 µs blocked), so that /debug/pprof/mutex?seconds=N and
// /debug/pprof/block?seconds=N show where requests wait.
func (m *Metrics) Handler(pprof bool, checks ...Check) http.Handler {
	mux := http.NewServeMux()
	if pprof {
		runtime.SetMutexProfileFraction(100)
		runtime.SetBlockProfileRate(100_000)
		mux.HandleFunc("/debug/pprof/", httppprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		ready := true
		for _, c := range checks {
			if err := c.Fn(); err != nil {
				mark := "[!]"
				if !c.Advisory {
					ready, mark = false, "[-]"
				}
				fmt.Fprintf(&b, "%s %s: %v\n", mark, c.Name, err)
			} else {
				fmt.Fprintf(&b, "[+] %s ok\n", c.Name)
			}
		}
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, b.String())
	})
	return mux
}

// UnaryInterceptor times unary gRPC calls and counts those that fail, by
// status code.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.ObserveStatus("grpc", method(info.FullMethod), grpcReason(status.Code(err)), start)
		return resp, err
	}
}

// StreamInterceptor times streaming gRPC calls and counts those that
// fail, by status code.
func (m *Metrics) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		m.ObserveStatus("grpc", method(info.FullMethod), grpcReason(status.Code(err)), start)
		return err
	}
}

// method turns "/kvstrata.v1.Cache/Get" into "get".
func method(full string) string {
	return strings.ToLower(full[strings.LastIndexByte(full, '/')+1:])
}
