package frontend

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvstrata/kvstrata/router/policy"
)

// complete posts a non-streamed completion of prompt to the API at url
// with the "kvstrata" object kv ("" none), and returns the status and body.
func complete(t *testing.T, url string, prompt []uint32, kv string) (int, string) {
	t.Helper()
	p, _ := json.Marshal(prompt)
	body := `{"model": "kvstrata-frontend-test", "max_tokens": 2, "ignore_eos": true, "prompt": ` + string(p)
	if kv != "" {
		body += `, "kvstrata": ` + kv
	}
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader([]byte(body+"}")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// byPolicy is r's routing decisions so far under policy p, per worker.
func byPolicy(r *Router, ws []*testWorker, p policy.Policy) []float64 {
	var n []float64
	for _, w := range ws {
		n = append(n, testutil.ToFloat64(r.m.decisions.WithLabelValues(w.spec.URL, p.String())))
	}
	return n
}

// TestRoutingOverrideRoutesAsItsPolicy: under kv-hbm, a prompt whose prefix
// one worker holds goes to that worker; the same prompt with the override
// {"policy": "round-robin"} goes to each worker in turn, and with an
// override of temperature and weight it is still routed by kv-hbm.
func TestRoutingOverrideRoutesAsItsPolicy(t *testing.T) {
	ws := startWorkers(t, 2, "sim", "")
	r, reg := newRouter(t, Config{Workers: specs(ws), Namespace: namespace(ws), Policy: policy.Config{Policy: policy.KVHBM}})
	api := serveAPI(t, r, reg, nil)
	prompt := ids(1, 256)
	var holder int
	holder = routedTo(t, r, ws, func() {
		if code, body := complete(t, api.URL, prompt, ""); code != http.StatusOK {
			t.Fatalf("first request: %d %s", code, body)
		}
	})
	hashes := namespace(ws).Hashes(prompt)
	waitFor(t, "the index learns the first request's blocks", func() bool {
		for _, m := range r.Index().Overlap(r.ns, hashes, nil) {
			if m.Worker == r.workerSet().list[holder].id && m.Blocks == len(hashes) {
				return true
			}
		}
		return false
	})
	for _, kv := range []string{"", `{"temperature": 0, "overlap_weight": 2}`} {
		if got := routedTo(t, r, ws, func() { complete(t, api.URL, prompt, kv) }); got != holder {
			t.Fatalf("kv-hbm with override %q sent the prompt to worker %d, not its holder %d", kv, got, holder)
		}
	}
	for i := range 4 {
		if code, body := complete(t, api.URL, prompt, `{"policy": "round-robin"}`); code != http.StatusOK {
			t.Fatalf("round-robin request %d: %d %s", i, code, body)
		}
	}
	if got := byPolicy(r, ws, policy.RoundRobin); got[0] != 2 || got[1] != 2 {
		t.Errorf("4 requests overridden to round-robin were routed %v by round-robin, want 2 to each worker", got)
	}
	if got := byPolicy(r, ws, policy.KVHBM); got[0]+got[1] != 3 {
		t.Errorf("%v decisions by kv-hbm, want the 3 requests without a policy override", got)
	}
}

// TestBadRoutingOverrideIs400: an override with an unknown policy, a bad
// value, a misspelt or mistyped field is answered 400 saying what is wrong,
// and nothing is routed.
func TestBadRoutingOverrideIs400(t *testing.T) {
	ws := startWorkers(t, 1, "sim", "")
	r, reg := newRouter(t, Config{Workers: specs(ws), Namespace: namespace(ws)})
	api := serveAPI(t, r, reg, nil)
	for kv, want := range map[string]string{
		`{"policy": "best"}`:                         `unknown policy "best"`,
		`{"temperature": -1}`:                        "temperature is -1, must be ≥ 0",
		`{"overlap_weight": 0}`:                      "overlap weight is 0, must be positive",
		`{"policy": "random", "overlap_weight": -2}`: "overlap weight is -2",
		`{"polcy": "random"}`:                        `unknown field "polcy"`,
		`{"temperature": "hot"}`:                     "kvstrata.temperature: expected float64",
		`["kv-hbm"]`:                                 "kvstrata: expected an object",
		`{"busy_prefill_tokens": 1.5}`:               "kvstrata.busy_prefill_tokens",
	} {
		code, body := complete(t, api.URL, ids(2, 64), kv)
		var e struct{ Error struct{ Message string } }
		json.Unmarshal([]byte(body), &e)
		if code != http.StatusBadRequest || !strings.Contains(e.Error.Message, want) {
			t.Errorf("override %s: %d %s; want 400 saying %q", kv, code, body, want)
		}
	}
	for _, p := range policy.Policies() {
		if n := byPolicy(r, ws, p); n[0] != 0 {
			t.Errorf("%v requests with a bad override were routed by %s", n[0], p)
		}
	}
	if code, body := complete(t, api.URL, ids(2, 64), `{"policy": "least-loaded", "busy_block_fraction": -1}`); code != http.StatusOK {
		t.Errorf("a good override: %d %s", code, body)
	}
}
