package frontend

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/router/kvindex"
	"github.com/prometheus/client_golang/prometheus"
)

// worker is one worker, static or discovered, as the Router sees it.
type worker struct {
	r      *Router
	id     kvindex.WorkerID
	spec   WorkerSpec
	name   string
	static bool // from Config.Workers: discovery never removes it
	blocks int  // its pool in blocks, for the busy threshold; 0 unknown
	// ctx ends when the worker is removed (stop) or the Router closes;
	// watched is closed once its watch has returned.
	ctx     context.Context
	stop    context.CancelFunc
	watched chan struct{}
	// healthy is false from a failure until a probe of /health succeeds.
	healthy atomic.Bool
	poke    chan struct{} // a failure was seen: probe on the backoff's schedule
	// collector is its KV-event intake's metrics, registered while it is
	// in the set; nil without.
	collector prometheus.Collector
}

// clear forgets the worker's pool: its event publisher restarted, or
// events were lost.
func (w *worker) clear() { w.r.kv.ClearWorker(w.id) }

// down takes the worker out of the candidates at once; its watch probes
// it back.
func (w *worker) down(cause string, err error) {
	if w.healthy.CompareAndSwap(true, false) {
		w.r.m.healthy.WithLabelValues(w.name).Set(0)
		w.r.cfg.Logger.Warn("frontend: worker left the candidates", "worker", w.name, "cause", cause, "err", err)
	}
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// watch checks the worker's /health every HealthInterval while it is
// healthy, and probes it with a doubling backoff, up to ProbeMax, while it
// is not.
func (w *worker) watch() {
	cfg := &w.r.cfg
	backoff := cfg.HealthInterval
	t := time.NewTimer(cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-w.poke:
			backoff = cfg.HealthInterval
		case <-t.C:
			err := w.check()
			switch {
			case err != nil:
				w.down("health", err)
				<-w.poke // down's own poke
				backoff = min(backoff*2, cfg.ProbeMax)
			case !w.healthy.Load():
				w.healthy.Store(true)
				w.r.m.healthy.WithLabelValues(w.name).Set(1)
				w.r.cfg.Logger.Info("frontend: worker is back", "worker", w.name)
				w.r.released()
				backoff = cfg.HealthInterval
			}
		}
		wait := cfg.HealthInterval
		if !w.healthy.Load() {
			wait = backoff
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(wait)
	}
}

// check asks the worker's /health.
func (w *worker) check() error {
	ctx, cancel := context.WithTimeout(w.ctx, w.r.cfg.HealthTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.spec.URL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := w.r.http.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/health answered %s", resp.Status)
	}
	return nil
}
