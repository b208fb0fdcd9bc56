package frontend

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/engine/kvevents"
)

// The KV-event intake's series are read from the Subscribers' and the
// Listener's counters when scraped.

// subscriberSeries are the names and help of one worker's series, each
// labelled worker="URL".
var subscriberSeries = []struct{ name, help string }{
	{"kvstrata_frontend_kv_event_batches_total", "KV-event batches applied to the index, by worker (those recovered by replay included)."},
	{"kvstrata_frontend_kv_event_batches_replayed_total", "KV-event batches recovered from a worker's replay socket after a gap, by worker."},
	{"kvstrata_frontend_kv_event_batches_lost_total", "KV-event batches neither heard nor recovered, by worker (each loss clears the worker in the index)."},
	{"kvstrata_frontend_kv_event_publisher_restarts_total", "Restarts of a worker's event publisher seen (sequence numbers went back), by worker."},
	{"kvstrata_frontend_kv_event_malformed_total", "Messages of a worker's topic or connection that were not vLLM event batches, skipped, by worker."},
}

var (
	descListener = prometheus.NewDesc("kvstrata_frontend_kv_event_listener_messages_total",
		"Messages the bind mode's socket heard, by what became of them: heard (handed to a worker's subscriber), unknown_topic, malformed or dropped (a worker's queue was full).",
		[]string{"outcome"}, nil)
	descListenerConns = prometheus.NewDesc("kvstrata_frontend_kv_event_listener_closed_connections_total",
		"Connections the bind mode's socket closed: bad_peer (not ZMTP, over the message limit, no handshake in time) or refused (over the connection limit).",
		[]string{"reason"}, nil)
)

// subscriberCollector exports one worker's Subscriber counters (the
// worker is a constant label: one collector per worker).
type subscriberCollector struct {
	descs []*prometheus.Desc // subscriberSeries'
	sub   *kvevents.Subscriber
}

func newSubscriberCollector(worker string, sub *kvevents.Subscriber) subscriberCollector {
	c := subscriberCollector{sub: sub}
	for _, s := range subscriberSeries {
		c.descs = append(c.descs, prometheus.NewDesc(s.name, s.help, nil, prometheus.Labels{"worker": worker}))
	}
	return c
}

func (c subscriberCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c subscriberCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.sub.Stats()
	for i, v := range []uint64{st.Delivered, st.Replayed, st.Lost, st.Resets, st.Malformed} {
		ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.CounterValue, float64(v))
	}
}

// listenerCollector exports the bind mode's Listener counters.
type listenerCollector struct{ l *kvevents.Listener }

func (c listenerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descListener
	ch <- descListenerConns
}

func (c listenerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.l.Stats()
	for outcome, v := range map[string]uint64{"heard": st.Heard, "unknown_topic": st.UnknownTopic, "malformed": st.Malformed, "dropped": st.Dropped} {
		ch <- prometheus.MustNewConstMetric(descListener, prometheus.CounterValue, float64(v), outcome)
	}
	for reason, v := range map[string]uint64{"bad_peer": st.BadPeers, "refused": st.Refused} {
		ch <- prometheus.MustNewConstMetric(descListenerConns, prometheus.CounterValue, float64(v), reason)
	}
}
