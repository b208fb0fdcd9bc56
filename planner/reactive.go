package planner

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Defaults of a ReactiveConfig, those of Dynamo's load-based planner.
const (
	DefaultReactiveQueueUp   = 5
	DefaultReactiveQueueDown = 0.2
	DefaultReactiveKVUp      = 0.9
	DefaultReactiveKVDown    = 0.5
)

// ErrReactiveConfig marks a ReactiveConfig NewReactive refuses.
var ErrReactiveConfig = errors.New("planner: bad reactive config")

// ReactiveConfig is a reactive planner's settings; zero fields take the
// defaults named.
type ReactiveConfig struct {
	// Pool is the pool scaled. The default is Aggregated.
	Pool Pool
	// Limits bound the pool. The default minimum is 1; the maximum is
	// required.
	Limits Limits
	// QueueUp and QueueDown are requests waiting per ready worker: above
	// QueueUp a worker is added. The defaults are 5 and 0.2.
	QueueUp, QueueDown float64
	// KVUp and KVDown are the ready workers' mean KV-pool usage, in
	// [0, 1]: above KVUp a worker is added. The defaults are 0.9 and 0.5.
	// A worker is removed only when the queue is under QueueDown and the
	// usage under KVDown.
	KVUp, KVDown float64
}

// Reactive is the baseline the planner is measured against: Dynamo's
// load-based planner. It predicts nothing and knows no profile: each
// interval it adds one worker when the queue per worker or the KV usage
// is above its threshold, removes one when both are below theirs, and
// holds while a previous change is still starting. It is driven by one
// goroutine.
type Reactive struct {
	cfg  ReactiveConfig
	conn Connector
	seq  uint64
}

// NewReactive is a reactive planner that scales through c.
func NewReactive(cfg ReactiveConfig, c Connector) (*Reactive, error) {
	if cfg.Pool == "" {
		cfg.Pool = Aggregated
	}
	if cfg.Limits.Min == 0 {
		cfg.Limits.Min = 1
	}
	if cfg.QueueUp == 0 {
		cfg.QueueUp = DefaultReactiveQueueUp
	}
	if cfg.QueueDown == 0 {
		cfg.QueueDown = DefaultReactiveQueueDown
	}
	if cfg.KVUp == 0 {
		cfg.KVUp = DefaultReactiveKVUp
	}
	if cfg.KVDown == 0 {
		cfg.KVDown = DefaultReactiveKVDown
	}
	var probs []string
	if cfg.Limits.Min < 1 || cfg.Limits.Max < cfg.Limits.Min {
		probs = append(probs, fmt.Sprintf("limits [%d, %d] must satisfy 1 ≤ min ≤ max", cfg.Limits.Min, cfg.Limits.Max))
	}
	if !(cfg.QueueDown >= 0 && cfg.QueueDown < cfg.QueueUp) {
		probs = append(probs, fmt.Sprintf("queue thresholds down %v and up %v must satisfy 0 ≤ down < up", cfg.QueueDown, cfg.QueueUp))
	}
	if !(cfg.KVDown >= 0 && cfg.KVDown < cfg.KVUp && cfg.KVUp <= 1) {
		probs = append(probs, fmt.Sprintf("KV thresholds down %v and up %v must satisfy 0 ≤ down < up ≤ 1", cfg.KVDown, cfg.KVUp))
	}
	if c == nil {
		probs = append(probs, "no connector")
	}
	if len(probs) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrReactiveConfig, strings.Join(probs, "; "))
	}
	return &Reactive{cfg: cfg, conn: c}, nil
}

// Step decides from one window: obs's queue depth and kvUsage, the ready
// workers' mean KV-pool usage at the window's end (0 when unknown: the
// queue alone decides then). The Decision's Need is the queue per ready
// worker.
func (r *Reactive) Step(ctx context.Context, obs Observation, kvUsage float64) (Decision, error) {
	reps, err := r.conn.Replicas(ctx)
	if err != nil {
		return Decision{}, fmt.Errorf("planner: reactive: replicas: %w", err)
	}
	cur := reps[r.cfg.Pool]
	r.seq++
	d := Decision{Seq: r.seq, At: obs.End, Pool: r.cfg.Pool, Current: cur.Desired, Target: cur.Desired, Mode: ModeActive, Reason: "hold"}
	perWorker := obs.QueueDepth / float64(max(cur.Ready, 1))
	d.Need = perWorker
	switch {
	case !obs.OK, cur.Ready < cur.Desired: // blind, or a change still starting
	case perWorker > r.cfg.QueueUp || kvUsage > r.cfg.KVUp:
		d.Target, d.Reason = cur.Desired+1, "load"
	case perWorker < r.cfg.QueueDown && kvUsage < r.cfg.KVDown:
		d.Target, d.Reason = cur.Desired-1, "load"
	}
	d.Target = min(max(d.Target, r.cfg.Limits.Min), r.cfg.Limits.Max)
	if d.Target == cur.Desired {
		if d.Reason == "load" {
			d.Reason = "hold"
		}
		return d, nil
	}
	if err := r.conn.Scale(ctx, r.cfg.Pool, d.Target); err != nil {
		return d, fmt.Errorf("planner: reactive: scale %s to %d: %w", r.cfg.Pool, d.Target, err)
	}
	d.Applied = true
	return d, nil
}
