// Package metrics exports a cache node to Prometheus. Tier and cluster
// state are read from the node when Prometheus scrapes; request latencies,
// failures and data-plane bytes are observed by thin wrappers around the
// front ends (a gRPC interceptor, a data-plane observer, a RESP command
// hook), so no front end knows Prometheus exists. Every label value comes
// from a bounded set (operations the front ends define, statuses, the
// reasons listed in status.go), so no client can make series. Every
// method is safe on a nil *Metrics, and safe for concurrent use.
package metrics

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

const namespace = "kvstrata"

// Metrics holds a node's Prometheus registry and the collectors the front
// ends feed.
type Metrics struct {
	Registry  *prometheus.Registry
	latency   *prometheus.HistogramVec
	errors    *prometheus.CounterVec
	dataBytes *prometheus.CounterVec
	tiers     *tierCollector
}

// LatencyBuckets are request_duration_seconds's bucket bounds: 1, 2.5 and
// 5 of each power of ten from 1µs to 10s (22 buckets). A data-plane get
// of a block in DRAM takes a few µs, a Redis GET of a missing key less,
// an object-store read tens of ms: each falls in a bucket of its own.
var LatencyBuckets = []float64{
	1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
	0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// StatsFunc returns a hierarchy's counters at scrape time.
type StatsFunc func() tiers.HierarchyStats

// New registers the node's metrics (and the Go runtime's and process's).
func New(stats StatsFunc, info map[string]string) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		tiers:    &tierCollector{stats: stats},
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "request_duration_seconds",
			Help: "Time to serve a request, by front end (grpc, data, resp), operation and status " +
				"(ok; miss: the block or key is not there; error: see request_errors_total).",
			Buckets: LatencyBuckets,
		}, []string{"api", "op", "status"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "request_errors_total",
			Help: "Requests that failed, by front end (grpc, data, resp), operation and reason " +
				"(gRPC: the status code; RESP: the error reply's code; data plane: full, unavailable, refused, corrupt, error).",
		}, []string{"api", "op", "reason"}),
		dataBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "data_plane_bytes_total",
			Help: "Block bytes moved by the data plane, by direction (in: puts, out: gets).",
		}, []string{"direction"}),
	}
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.latency, m.errors, m.dataBytes,
		m.tiers,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "build_info", Help: "Build and node information; always 1.",
			ConstLabels: info,
		}, func() float64 { return 1 }),
	)
	return m
}

// Observe records the latency of one request that started at start and
// was served.
func (m *Metrics) Observe(api, op string, start time.Time) { m.ObserveStatus(api, op, "ok", start) }

// DataBytes counts block bytes moved by the data plane.
func (m *Metrics) DataBytes(direction string, n int) {
	if m == nil {
		return
	}
	m.dataBytes.WithLabelValues(direction).Add(float64(n))
}

// TenantName names a tenant by its tag ("" when it knows none): the users
// file's tenants, on a node that authenticates its clients.
type TenantName func(index.TenantTag) string

// NameTenants labels the tenant metrics with the names fn gives their
// tags (label tenant) from the next scrape on; nil leaves them unnamed.
// The daemon sets it where the users file is read, and again on reload.
func (m *Metrics) NameTenants(fn TenantName) {
	if m == nil {
		return
	}
	m.tiers.names.Store(&fn)
}

// DeviceBytes reads the bytes of blocks in GPU memory the data plane sent
// straight from device memory and through pinned host memory.
type DeviceBytes func() (direct, staged int64)

// WatchDeviceBytes exports fn as kvstrata_dataplane_device_bytes_total,
// by path (direct, staged).
func (m *Metrics) WatchDeviceBytes(fn DeviceBytes) {
	if m == nil {
		return
	}
	for _, path := range []string{"direct", "staged"} {
		m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        namespace + "_dataplane_device_bytes_total",
			Help:        "Bytes of blocks held in GPU memory the data plane sent, by path: direct (from device memory, UCX with CUDA) or staged (through pinned host memory).",
			ConstLabels: prometheus.Labels{"path": path},
		}, func() float64 {
			direct, staged := fn()
			if path == "direct" {
				return float64(direct)
			}
			return float64(staged)
		}))
	}
}

// RESPStats is what the RESP server counts, read at scrape time.
type RESPStats func() (commands map[string]uint64, clients int)

// WatchRESP exports the RESP server's command counts and connections.
func (m *Metrics) WatchRESP(stats RESPStats) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(respCollector(stats))
}

var (
	descCommands = prometheus.NewDesc(namespace+"_resp_commands_total", "Redis-protocol commands served, by command.", []string{"command"}, nil)
	descClients  = prometheus.NewDesc(namespace+"_resp_connected_clients", "Open Redis-protocol connections.", nil, nil)
)

type respCollector RESPStats

func (c respCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descCommands; ch <- descClients }

func (c respCollector) Collect(ch chan<- prometheus.Metric) {
	cmds, clients := c()
	for name, n := range cmds {
		ch <- prometheus.MustNewConstMetric(descCommands, prometheus.CounterValue, float64(n), name)
	}
	ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(clients))
}

// tierCollector reads the hierarchy's counters when Prometheus scrapes.
type tierCollector struct {
	stats StatsFunc
	names atomic.Pointer[TenantName]
}

var (
	tierLabels      = []string{"tier"}
	descCapacity    = desc("tier_capacity_bytes", "Bytes a tier may hold.")
	descUsed        = desc("tier_used_bytes", "Bytes a tier holds, allocation overhead included.")
	descBlocks      = desc("tier_blocks", "Blocks a tier holds.")
	descHits        = desc("tier_hits_total", "Gets served by a tier.")
	descMissesTier  = desc("tier_misses_total", "Gets that reached a tier (missed every faster one) and were not served by it.")
	descUnreachable = desc("tier_unreachable_total", "Gets of blocks a tier holds that failed because it could not be reached then "+
		"(an object store that is down): cached but out of reach, answered as unavailable rather than as misses.")
	descEvictions      = desc("tier_evictions_total", "Blocks a tier gave up to make room.")
	descDrops          = desc("tier_drops_total", "Evictions that kept no copy in a lower tier.")
	descDemotions      = desc("tier_demotions_total", "Blocks a tier received from the tier above.")
	descPromotions     = desc("tier_promotions_total", "Blocks a tier received from below.")
	descAvailable      = desc("tier_available", "1 while a tier can be reached, 0 while it cannot (an object store that is down).")
	descDegraded       = desc("tier_degraded", "1 while a tier can be read but refuses writes (a local disk that is full), else 0.")
	descDetail         = prometheus.NewDesc(namespace+"_tier_detail", "A tier's own counters and gauges (the object store's objects, segments, request errors …), by stat.", []string{"tier", "stat"}, nil)
	descQuotaEvictions = desc("tier_quota_evictions_total", "Evictions that made room for a block within its tenant's quota on a tier, "+
		"of that tenant's own blocks.")
	tenantLabels    = []string{"tenant_tag", "tenant", "tier"}
	descTenantBytes = prometheus.NewDesc(namespace+"_tenant_bytes", "Bytes of a tenant's blocks a tier holds (block sizes, "+
		"allocation overhead excluded), by tenant tag (the top 16 bits of its namespaces) and name when known.", tenantLabels, nil)
	descTenantBlocks = prometheus.NewDesc(namespace+"_tenant_blocks", "Blocks of a tenant a tier holds.", tenantLabels, nil)
	descTenantQuota  = prometheus.NewDesc(namespace+"_tenant_quota_bytes", "A tenant's quota on a tier, for tenants that have one "+
		"there: past it, the tenant's own blocks are evicted first.", tenantLabels, nil)
	descGets   = prometheus.NewDesc(namespace+"_gets_total", "Block gets.", nil, nil)
	descMisses = prometheus.NewDesc(namespace+"_misses_total", "Block gets that found the block in no tier.", nil, nil)
	descKeys   = prometheus.NewDesc(namespace+"_blocks", "Distinct blocks held in some tier.", nil, nil)
	descPins   = prometheus.NewDesc(namespace+"_pinned_blocks", "Blocks under an unreleased lease.", nil, nil)
)

func desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(namespace+"_"+name, help, tierLabels, nil)
}

func (c *tierCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descUsed, descBlocks, descHits, descMissesTier, descUnreachable, descEvictions,
		descDrops, descDemotions, descPromotions, descAvailable, descDegraded, descDetail, descGets, descMisses, descKeys, descPins,
		descQuotaEvictions, descTenantBytes, descTenantBlocks, descTenantQuota} {
		ch <- d
	}
}

func (c *tierCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	var name TenantName
	if p := c.names.Load(); p != nil {
		name = *p
	}
	reached := s.Gets // gets that reached the current level
	for _, l := range s.Levels {
		t := l.Kind.String()
		gauge := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), t)
		}
		counter := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), t)
		}
		gauge(descCapacity, l.Capacity)
		gauge(descUsed, l.Used)
		gauge(descBlocks, l.Blocks)
		counter(descHits, l.Hits)
		reached -= l.Hits
		counter(descMissesTier, reached)
		counter(descUnreachable, l.Unreachable)
		reached -= l.Unreachable // they went no further down
		counter(descEvictions, l.Evictions)
		counter(descDrops, l.Drops)
		counter(descDemotions, l.Demotions)
		counter(descPromotions, l.Promotions)
		up := int64(1)
		if l.Unavailable != nil {
			up = 0
		}
		gauge(descAvailable, up)
		degraded := int64(0)
		if l.Degraded != nil {
			degraded = 1
		}
		gauge(descDegraded, degraded)
		for stat, v := range l.Detail {
			ch <- prometheus.MustNewConstMetric(descDetail, prometheus.GaugeValue, float64(v), t, stat)
		}
		counter(descQuotaEvictions, l.QuotaEvictions)
		for _, u := range l.Tenants {
			tag, tenant := strconv.Itoa(int(u.Tenant)), ""
			if name != nil {
				tenant = name(u.Tenant)
			}
			ch <- prometheus.MustNewConstMetric(descTenantBytes, prometheus.GaugeValue, float64(u.Bytes), tag, tenant, t)
			ch <- prometheus.MustNewConstMetric(descTenantBlocks, prometheus.GaugeValue, float64(u.Blocks), tag, tenant, t)
			if u.Quota != tiers.NoQuota {
				ch <- prometheus.MustNewConstMetric(descTenantQuota, prometheus.GaugeValue, float64(u.Quota), tag, tenant, t)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descGets, prometheus.CounterValue, float64(s.Gets))
	ch <- prometheus.MustNewConstMetric(descMisses, prometheus.CounterValue, float64(s.Misses))
	ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(s.Keys))
	ch <- prometheus.MustNewConstMetric(descPins, prometheus.GaugeValue, float64(s.Pins))
}
