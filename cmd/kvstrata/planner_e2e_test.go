package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/planner"
)

// End-to-end test of `kvstrata planner`: a sim worker and the frontend as
// processes, the planner in advisory mode reading the frontend's /metrics.

// plannerStatus reads GET /v1/planner/status.
func plannerStatus(t *testing.T, addr string) (planner.Status, error) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/v1/planner/status")
	if err != nil {
		return planner.Status{}, err
	}
	defer resp.Body.Close()
	var s planner.Status
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("status %s", resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// waitPlannerStatus polls the status until cond holds.
func waitPlannerStatus(t *testing.T, pl *proc, what string, cond func(planner.Status) bool) planner.Status {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, err := plannerStatus(t, pl.http)
		if err == nil && cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s; last status %+v (%v)\n%s", what, s, err, pl.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPlannerAdvisesUnderLoadAndGoesToTheMinimumWhenIdle: under requests
// through the frontend the advisory planner's status shows a decision
// with a need > 0 and a pool above its minimum; when the traffic stops it
// drifts to the minimum (reason idle, need 0), its /metrics pass promtool
// and say so, and it never scaled anything.
func TestPlannerAdvisesUnderLoadAndGoesToTheMinimumWhenIdle(t *testing.T) {
	w := startWorkerProcess(t, "", "--model", "sim")
	_, url := startFrontendProcess(t, "", []*wproc{w}, "--model", "sim")
	pl := &proc{t: t, http: freeport.Addr(t)}
	pl.args = []string{"planner", "--frontend", url, "--mode", "advisory", "--interval", "1s", "--startup-delay", "1s",
		"--pools", "aggregated:0-4", "--slo-ttft", "2s", "--slo-itl", "50ms", "--listen", pl.http}
	pl.start()

	cl := frontendSDK(url)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				prompt := fmt.Sprintf("Client %d, request %d: a prompt about caches, tiers and planners.", i, n)
				if r := streamCompletion(cl, "kvstrata-sim", prompt, 16, nil); r.err != nil {
					t.Errorf("a request: %v", r.err)
					return
				}
			}
		})
	}
	busy := waitPlannerStatus(t, pl, "a decision with a need > 0", func(s planner.Status) bool {
		return len(s.Decisions) == 1 && s.Decisions[0].Need > 0 && s.Decisions[0].Target >= 1 && s.Predicted.ISL > 0
	})
	close(stop)
	wg.Wait()
	d := busy.Decisions[0]
	if d.Pool != planner.Aggregated || d.Mode != planner.ModeAdvisory || d.Applied || busy.ObservedRate <= 0 {
		t.Errorf("under load: %+v; want an advisory decision for the aggregated pool, not applied, a rate > 0", busy)
	}

	idle := waitPlannerStatus(t, pl, "the minimum after the traffic stopped", func(s planner.Status) bool {
		return len(s.Decisions) == 1 && s.Decisions[0].Target == 0 && s.Decisions[0].Reason == planner.ReasonIdle
	})
	if d := idle.Decisions[0]; d.Need != 0 || idle.IdleWindows < 2 || idle.Predicted.ISL != busy.Predicted.ISL && idle.Predicted.ISL <= 0 {
		t.Errorf("idle: %+v; want need 0 after 2 idle windows, the last ISL kept", idle)
	}

	resp, err := http.Get("http://" + pl.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`kvstrata_planner_desired_replicas{pool="aggregated"} 0`, `kvstrata_planner_need{pool="aggregated"} 0`,
		`kvstrata_planner_decisions_total{applied="false",direction="up",pool="aggregated"}`, `kvstrata_planner_predicted{series="isl"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics does not have %s:\n%s", want, body)
		}
	}
	if strings.Contains(string(body), "NaN") {
		t.Errorf("/metrics has a NaN:\n%s", body)
	}
	promtoolCheckWorker(t, string(body))
	if strings.Contains(pl.log.String(), "scale aggregated") && !strings.Contains(pl.log.String(), "advisory: would scale aggregated 0→") {
		t.Errorf("the log does not give the advice:\n%s", pl.log)
	}
}

// TestPlannerBadFlagsAreUsageErrors: wrong flags exit 2 and say what is
// wrong, every problem at once.
func TestPlannerBadFlagsAreUsageErrors(t *testing.T) {
	usageErrorSays(t, []string{"planner", "--frontend", "ftp://x", "--pools", "aggregated:3", "--manual", "respect", "--connector", "k8s"},
		`--frontend "ftp://x": want http://host:port`, `"aggregated:3" is not POOL:MIN-MAX`, `--manual "respect": want respect:DURATION`,
		`--connector "k8s": want one of kube, none, virtual`)
	usageErrorSays(t, []string{"planner", "--frontend", "http://127.0.0.1:1", "--mode", "active", "--pools", "aggregated:3-1", "--slo-ttft", "0s"},
		"--connector none scales nothing", "limits 3-1", "TTFT target is 0s")
	usageErrorSays(t, []string{"planner", "--prometheus", "http://127.0.0.1:1", "--frontend", "http://127.0.0.1:2"}, "--frontend or --prometheus: give exactly one")
	usageErrorSays(t, []string{"planner", "--frontend", "http://127.0.0.1:1", "--mode", "active", "--connector", "kube", "--kube-targets", "decode=Deployment/w"},
		`--kube-targets "decode=Deployment/w": no workload for pool aggregated`)
	usageErrorSays(t, []string{"planner", "--frontend", "http://127.0.0.1:1", "--predictor", "oracle"}, `unknown kind "oracle"`)
	usageErrorSays(t, []string{"planner", "--frontend", "http://127.0.0.1:1", "--slo-ttft-quantile", "1.5"}, "TTFT quantile is 1.5")
	usageErrorSays(t, []string{"planner", "--frontend", "http://127.0.0.1:1", "--profile", "/nonexistent/profile.json"}, `--profile "/nonexistent/profile.json"`)
}

// fakeKubeAPI is the part of a Kubernetes API server the kube connector
// uses, for one Deployment: get it, get and update its scale subresource.
// Its spec.replicas is ready at once.
type fakeKubeAPI struct {
	mu       sync.Mutex
	name     string
	replicas int
	version  int
	updates  []int
}

func (k *fakeKubeAPI) set(n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.replicas, k.version = n, k.version+1
}

func (k *fakeKubeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	defer k.mu.Unlock()
	base := "/apis/apps/v1/namespaces/default/deployments/" + k.name
	meta := fmt.Sprintf(`{"name":%q,"namespace":"default","resourceVersion":"%d"}`, k.name, k.version)
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == base:
		fmt.Fprintf(w, `{"apiVersion":"apps/v1","kind":"Deployment","metadata":%s,"spec":{"replicas":%d},"status":{"readyReplicas":%d}}`, meta, k.replicas, k.replicas)
	case r.Method == http.MethodGet && r.URL.Path == base+"/scale":
		fmt.Fprintf(w, `{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":%s,"spec":{"replicas":%d},"status":{"replicas":%d}}`, meta, k.replicas, k.replicas)
	case r.Method == http.MethodPut && r.URL.Path == base+"/scale":
		body, _ := io.ReadAll(r.Body)
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil) // JSON or protobuf
		s, ok := obj.(*autoscalingv1.Scale)
		if err != nil || !ok {
			http.Error(w, fmt.Sprintf("a %s body that is not a Scale: %v", r.Header.Get("Content-Type"), err), http.StatusBadRequest)
			return
		}
		k.replicas, k.version = int(s.Spec.Replicas), k.version+1
		k.updates = append(k.updates, k.replicas)
		fmt.Fprintf(w, `{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":%q,"namespace":"default","resourceVersion":"%d"},"spec":{"replicas":%d}}`, k.name, k.version, k.replicas)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"%s %s"}`, r.Method, r.URL.Path)
	}
}

func (k *fakeKubeAPI) state() (int, []int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.replicas, slices.Clone(k.updates)
}

// TestPlannerScalesADeploymentThroughTheKubeConnector: in active mode the
// planner scales a Deployment through an API server's scale subresource
// (client-go against a fake server): up at once under load, down to the
// minimum when the traffic stops, and a replica count someone else set is
// respected, as its log says.
func TestPlannerScalesADeploymentThroughTheKubeConnector(t *testing.T) {
	api := &fakeKubeAPI{name: "kvstrata-worker", replicas: 1, version: 1}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close) // after the planner is killed
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: %q}}]
users: [{name: planner, user: {token: test}}]
contexts: [{name: fake, context: {cluster: fake, user: planner, namespace: default}}]
current-context: fake
`, srv.URL)), 0o600)
	// A worker whose every prefill takes 500 ms: a few requests a second
	// need several workers for a 2 s TTFT.
	profile := filepath.Join(dir, "profile.json")
	os.WriteFile(profile, []byte(`{"version":1,"source":"test: slow prefill","prefill":{"poly":[500]},"decode":{"poly":[5.74,54.01,-25.74],"min_ms":1}}`), 0o644)

	w := startWorkerProcess(t, "", "--model", "sim")
	_, url := startFrontendProcess(t, "", []*wproc{w}, "--model", "sim")
	pl := &proc{t: t, http: freeport.Addr(t)}
	pl.args = []string{"planner", "--frontend", url, "--mode", "active", "--connector", "kube", "--kubeconfig", kubeconfig,
		"--kube-targets", "aggregated=Deployment/kvstrata-worker", "--profile", profile, "--interval", "1s", "--startup-delay", "1s",
		"--cooldown", "1s", "--pools", "aggregated:1-4", "--manual", "respect:1h", "--listen", pl.http}
	pl.start()

	cl := frontendSDK(url)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if r := streamCompletion(cl, "kvstrata-sim", fmt.Sprintf("Client %d, request %d.", i, n), 4, nil); r.err != nil {
					t.Errorf("a request: %v", r.err)
					return
				}
			}
		})
	}
	waitFor := func(what string, cond func(n int) bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			n, ups := api.state()
			if cond(n) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60 s; the deployment at %d after updates %v\n%s", what, n, ups, pl.log)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitFor("a scale-up under load", func(n int) bool { return n > 1 })
	close(stop)
	wg.Wait()
	waitFor("the minimum after the traffic stopped", func(n int) bool { return n == 1 })
	s, err := plannerStatus(t, pl.http)
	if err != nil || len(s.Decisions) != 1 || s.Decisions[0].Mode != planner.ModeActive {
		t.Fatalf("status %+v, %v", s, err)
	}

	api.set(3) // someone scales by hand
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(pl.log.String(), "manual change of aggregated to 3 observed (planner had 1); respected until") {
		if time.Now().After(deadline) {
			t.Fatalf("the log does not say the manual change is respected:\n%s", pl.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // three more windows, still idle
	if n, ups := api.state(); n != 3 {
		t.Errorf("the manual 3 was not respected: the deployment at %d after updates %v", n, ups)
	}
}
