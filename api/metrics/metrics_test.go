package metrics

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvstrata/kvstrata/tiers"
)

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler(false).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

func newTest() *Metrics {
	return New(func() tiers.HierarchyStats { return tiers.HierarchyStats{} }, map[string]string{"version": "test"})
}

// TestStatusesAndErrors: each front end's outcomes land in the histogram
// as ok, miss or error, failures are counted by reason, and a reason
// outside its bounded set is counted as "other".
func TestStatusesAndErrors(t *testing.T) {
	m := newTest()
	start := time.Now()
	m.ObserveRESP("get", "ok", start)
	m.ObserveRESP("set", "oom", start)
	m.ObserveRESP("set", "whatever-a-client-made-up", start)
	m.ObserveData("out", 4096, start, "ok")
	m.ObserveData("out", 0, start, "not_found")
	m.ObserveData("in", 4096, start, "full")
	m.ObserveData("in", 4096, start, "strange")
	m.ObserveStatus("grpc", "get", grpcReason(codes.DeadlineExceeded), start)
	m.Observe("grpc", "info", start)
	body := scrape(t, m)
	for _, want := range []string{
		`kvstrata_request_duration_seconds_count{api="resp",op="get",status="ok"} 1`,
		`kvstrata_request_duration_seconds_count{api="resp",op="set",status="error"} 2`,
		`kvstrata_request_errors_total{api="resp",op="set",reason="oom"} 1`,
		`kvstrata_request_errors_total{api="resp",op="set",reason="other"} 1`,
		`kvstrata_request_duration_seconds_count{api="data",op="get",status="ok"} 1`,
		`kvstrata_request_duration_seconds_count{api="data",op="get",status="miss"} 1`,
		`kvstrata_request_errors_total{api="data",op="put",reason="full"} 1`,
		`kvstrata_request_errors_total{api="data",op="put",reason="other"} 1`,
		`kvstrata_data_plane_bytes_total{direction="out"} 4096`,
		`kvstrata_request_errors_total{api="grpc",op="get",reason="deadline_exceeded"} 1`,
		`kvstrata_request_duration_seconds_count{api="grpc",op="info",status="ok"} 1`,
		`kvstrata_request_duration_seconds_bucket{api="grpc",op="info",status="ok",le="1e-06"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `direction="in"`) {
		t.Error("bytes of puts that failed are counted as moved")
	}
	if strings.Contains(body, `reason="not_found"`) {
		t.Error("a miss is counted as an error")
	}
}

func TestGRPCReasons(t *testing.T) {
	for c, want := range map[codes.Code]string{codes.OK: "ok", codes.NotFound: "not_found", codes.Unavailable: "unavailable",
		codes.ResourceExhausted: "resource_exhausted", codes.Code(99): "other"} {
		if got := grpcReason(c); got != want {
			t.Errorf("grpcReason(%v) = %q, want %q", c, got, want)
		}
	}
}

func TestLatencyBuckets(t *testing.T) {
	b := LatencyBuckets
	if b[0] != 1e-6 || b[len(b)-1] != 10 || len(b) != 22 {
		t.Fatalf("buckets %v: want 22 from 1µs to 10s", b)
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			t.Fatalf("buckets not increasing at %d: %v", i, b)
		}
	}
}

// TestClusterMetrics: the cluster's state reads as gauges, the apply lag
// as the commit index less the applied one, members by liveness, the
// node's directory changes by outcome as counters.
func TestClusterMetrics(t *testing.T) {
	m := newTest()
	m.WatchCluster(func() ClusterState {
		return ClusterState{Leader: 2, Term: 7, CommitIndex: 120, AppliedIndex: 100, LastContact: -1, MembersUp: 2, MembersDown: 1,
			Publishing: Publishing{Queued: 50, Committed: 40, Unchanged: 900, Dropped: 3, Batches: 4}}
	})
	body := scrape(t, m)
	for _, want := range []string{"kvstrata_raft_is_leader 0", "kvstrata_raft_leader_id 2", "kvstrata_raft_term 7",
		"kvstrata_raft_commit_index 120", "kvstrata_raft_applied_index 100", "kvstrata_raft_apply_lag_entries 20",
		"kvstrata_raft_last_contact_seconds -1", "kvstrata_raft_replica_current 0",
		`kvstrata_cluster_members{liveness="up"} 2`, `kvstrata_cluster_members{liveness="down"} 1`,
		`kvstrata_directory_changes_total{outcome="queued"} 50`, `kvstrata_directory_changes_total{outcome="committed"} 40`,
		`kvstrata_directory_changes_total{outcome="unchanged"} 900`, `kvstrata_directory_changes_total{outcome="dropped"} 3`,
		"kvstrata_directory_batches_total 4"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !bytes.Contains([]byte(body), []byte("# TYPE kvstrata_raft_term gauge")) {
		t.Error("no TYPE line for kvstrata_raft_term")
	}
	promtoolCheck(t, body)
}

func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.ObserveRESP("get", "ok", time.Now())
	m.ObserveData("out", 1, time.Now(), "ok")
	m.ObserveStatus("grpc", "get", "ok", time.Now())
	m.WatchCluster(nil)
}
