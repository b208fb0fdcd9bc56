package frontend

import (
	"fmt"

	"github.com/kvstrata/kvstrata/engine/kvevents"
)

// The Router hears each worker's KV events in one of two ways:
//   - connect mode (WorkerSpec.Events): a kvevents.Subscriber of its own
//     dials the worker's PUB socket, as vLLM's publisher binds by default
//     (tcp://*:5557);
//   - bind mode (WorkerSpec.Topic without Events): the worker's PUB socket
//     connects to the Router's listening SUB socket (Config.EventsBind), as
//     vLLM's publisher does when its endpoint is not a wildcard bind, and
//     its messages are told from other workers' by their topic (vLLM's
//     KVEventsConfig.topic, the first frame of each message). Sequence
//     numbers, gaps and restarts are per worker, as in connect mode.
//
// Either way the worker's replay socket (WorkerSpec.Replay, a ROUTER the
// worker binds) is dialed to recover gaps, and a restart or lost events
// clear what the index holds for that worker.

// validateEvents reports the problems of c's event settings through bad.
func (c *Config) validateEvents(bad func(format string, args ...any)) {
	if c.EventsBind != "" {
		lc := kvevents.ListenerConfig{Endpoint: c.EventsBind}
		if err := lc.Validate(); err != nil {
			bad("events bind %q: %v", c.EventsBind, err)
		}
	}
	topics := map[string]string{}
	for _, w := range c.Workers {
		switch {
		case w.Events != "" || w.Topic == "":
		case c.EventsBind == "":
			bad("worker %q has a topic but no events endpoint, and no events bind endpoint to hear it on", w.URL)
		case topics[w.Topic] != "":
			bad("workers %q and %q both publish on topic %q: in bind mode a topic names one worker", topics[w.Topic], w.URL, w.Topic)
		default:
			topics[w.Topic] = w.URL
		}
	}
}

// listenEvents opens the bind mode's listening socket, if configured.
func (r *Router) listenEvents() error {
	if r.cfg.EventsBind == "" {
		return nil
	}
	l, err := kvevents.NewListener(kvevents.ListenerConfig{Endpoint: r.cfg.EventsBind})
	if err != nil {
		return fmt.Errorf("frontend: KV events: %w", err)
	}
	r.events = l
	if r.cfg.Registerer != nil {
		return r.cfg.Registerer.Register(listenerCollector{l})
	}
	return nil
}

// EventsAddr is where the bind mode's socket listens ("" without one).
func (r *Router) EventsAddr() string {
	if r.events == nil {
		return ""
	}
	return r.events.Addr()
}

// followEvents starts following w's KV events into the index, if it
// publishes any.
func (r *Router) followEvents(w *worker) error {
	spec := w.spec
	cfg := kvevents.SubscriberConfig{
		Endpoint: spec.Events, ReplayEndpoint: spec.Replay, Topic: spec.Topic,
		OnReset: w.clear, OnLost: func(int64, int64) { w.clear() },
	}
	var sub *kvevents.Subscriber
	var err error
	switch {
	case spec.Events != "":
		sub, err = kvevents.NewSubscriber(cfg)
	case spec.Topic != "" && r.events != nil:
		sub, err = r.events.Subscriber(cfg)
	default:
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: worker %s: %v", ErrBadConfig, spec.URL, err)
	}
	if r.cfg.Registerer != nil {
		c := newSubscriberCollector(w.name, sub)
		if err := r.cfg.Registerer.Register(c); err != nil {
			return err
		}
		w.collector = c
	}
	r.wg.Go(func() { sub.Run(w.ctx, func(_ int64, b *kvevents.Batch) { r.kv.Apply(w.id, b) }) })
	return nil
}

// closeEvents closes the bind mode's socket, once the Subscribers are
// done.
func (r *Router) closeEvents() {
	if r.events != nil {
		r.events.Close()
	}
}
