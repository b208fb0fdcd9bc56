package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

// The monitoring files under deploy/, relative to this package.
const (
	dashboardFile  = "../../deploy/grafana/kvstrata.json"
	alertsFile     = "../../deploy/prometheus/alerts.yaml"
	alertTestsFile = "../../deploy/prometheus/alerts_test.yaml"
)

// TestAlertRulesPassPromtool: the alerting rules are valid (promtool check
// rules) and their unit tests pass (promtool test rules): each alert fires
// on the series that should raise it, and only after its "for".
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", alertTestsFile}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestDashboardAndAlertsReadARealNode: every metric the Grafana dashboard
// and the alerting rules name is one a real node exports, every label
// value of tier_detail they select too; a real Prometheus server scraping
// the node answers each dashboard query (with data, but for the object
// store's, which this node has not), loads the rules with every one
// evaluating, and raises none of the node-down or no-leader alerts.
func TestDashboardAndAlertsReadARealNode(t *testing.T) {
	dash := dashboardQueries(t)
	alerts := alertExprs(t)
	p := startNode(t, t.TempDir())
	traffic(t, p)
	exported := exportedNames(t, p)
	for _, q := range append(slices.Clone(dash), alerts...) {
		for _, name := range metricNames(t, q) {
			if !exported[name] && name != "up" { // up is the scrape's own series
				t.Errorf("%q names %s, which the node does not export", q, name)
			}
		}
		for _, m := range regexp.MustCompile(`stat="([a-z_]+)"`).FindAllStringSubmatch(q, -1) {
			if m[0] != `stat="pending_bytes"` && m[0] != `stat="request_errors"` && !exported["detail "+m[0]] {
				t.Errorf("%q selects tier_detail's %s, which the node's SSD tier does not report", q, m[0])
			}
		}
	}
	if t.Failed() {
		return
	}

	prom := startPrometheusFor(t, p.http)
	// Two scrapes after the traffic, so that every rate has samples.
	waitQuery(t, prom, `count_over_time(kvstrata_gets_total[1m]) >= 3`)
	for _, q := range dash {
		q = strings.NewReplacer("$__rate_interval", "1m", "$job", "kvstrata", "$instance", ".*").Replace(q)
		res, err := query(prom, q)
		if err != nil {
			t.Errorf("dashboard query %s: %v", q, err)
		} else if len(res) == 0 && !strings.Contains(q, `tier="s3"`) {
			t.Errorf("dashboard query %s: no data from a node that served gets, puts and Redis commands", q)
		}
	}
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError, State string
				}
			}
		}
	}
	eventually(t, 30*time.Second, "every alerting rule evaluated", func() bool {
		rules.Data.Groups = nil
		getJSON(t, prom+"/api/v1/rules", &rules)
		n := 0
		for _, g := range rules.Data.Groups {
			for _, r := range g.Rules {
				if r.Health == "ok" {
					n++
				}
			}
		}
		return n == len(alerts)
	})
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			if (r.Name == "KvstrataNodeDown" || r.Name == "KvstrataRaftNoLeader") && r.State != "inactive" {
				t.Errorf("%s is %s on a healthy node", r.Name, r.State)
			}
		}
	}
}

// traffic makes a node serve what the dashboard shows: data-plane puts,
// gets and misses, gRPC calls, Redis commands (one of them failing).
func traffic(t *testing.T, p *proc) {
	t.Helper()
	c := p.client(client.Options{})
	keys := putBlocks(t, c, 1, 0, 4, 4096)
	if _, err := c.Get(context.Background(), append(keys, index.Key{NS: 1, Hash: 999})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stats(context.Background()); err != nil {
		t.Fatal(err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli not installed (Debian package redis-tools)")
	}
	host, port, _ := strings.Cut(p.resp, ":")
	for _, cmd := range [][]string{{"SET", "k", "v"}, {"GET", "k"}, {"GET", "absent"}, {"SET", "k"}} {
		out, err := exec.Command(cli, append([]string{"-h", host, "-p", port}, cmd...)...).CombinedOutput()
		if err != nil && len(cmd) > 2 { // SET k fails, as it should: an error reply
			t.Fatalf("redis-cli %v: %v\n%s", cmd, err, out)
		}
	}
	// The data plane counts a block sent once it releases it, a moment
	// after the client has it.
	eventually(t, 10*time.Second, "the data plane's get counted", func() bool {
		return exportedNames(t, p)["sample "+`kvstrata_request_duration_seconds_count{api="data",op="get",status="ok"}`]
	})
}

// exportedNames scrapes the node's /metrics: the metric names of its
// samples (histograms' _bucket, _sum and _count series and their family's
// name), "sample NAME{LABELS}" for each series, and "detail stat=\"X\""
// for each stat of tier_detail.
func exportedNames(t *testing.T, p *proc) map[string]bool {
	t.Helper()
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true // a histogram's family name is queried through its series only, but name it anyway
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		series, _, _ := strings.Cut(line, " ")
		name, _, _ := strings.Cut(series, "{")
		names[name] = true
		names["sample "+series] = true
		if name == "kvstrata_tier_detail" {
			if m := regexp.MustCompile(`stat="[a-z_]+"`).FindString(series); m != "" {
				names["detail "+m] = true
			}
		}
	}
	return names
}

// dashboardQueries returns the PromQL of every panel of the dashboard
// and of its template variables, checking that it is a Grafana dashboard.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type target struct{ Expr string }
	var d struct {
		Title, UID string
		Panels     []struct {
			Type, Title string
			Targets     []target
		}
		Templating struct {
			List []struct {
				Name, Type, Definition string
			}
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("%s has no title, uid or panels", dashboardFile)
	}
	var qs []string
	for _, p := range d.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			qs = append(qs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			if m := regexp.MustCompile(`^label_values\((.*), *[a-z_]+\)$`).FindStringSubmatch(v.Definition); m != nil {
				qs = append(qs, m[1])
			} else {
				t.Errorf("variable %s: %q is not label_values(series, label)", v.Name, v.Definition)
			}
		}
	}
	return qs
}

// alertExprs returns the expression of every alerting rule.
func alertExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	// promtool checks the file's structure (TestAlertRulesPassPromtool);
	// here each rule's expr is what matters: one line, or a block.
	var exprs []string
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "expr:") {
			continue
		}
		e := strings.TrimSpace(strings.TrimPrefix(l, "expr:"))
		if e == "|" {
			indent := len(lines[i+1]) - len(strings.TrimLeft(lines[i+1], " "))
			e = ""
			for i++; i < len(lines) && len(lines[i])-len(strings.TrimLeft(lines[i], " ")) >= indent && strings.TrimSpace(lines[i]) != ""; i++ {
				e += lines[i] + "\n"
			}
			i--
		}
		exprs = append(exprs, e)
	}
	if len(exprs) == 0 {
		t.Fatalf("%s has no alerting rule", alertsFile)
	}
	return exprs
}

// promqlWords are the functions, operators and keywords of PromQL the
// dashboard and the rules use; every other word outside label matchers,
// grouping clauses and strings is a metric name.
var promqlWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "topk": true, "bottomk": true, "rate": true,
	"irate": true, "increase": true, "deriv": true, "delta": true, "histogram_quantile": true, "vector": true,
	"count_over_time": true, "max_over_time": true, "min_over_time": true, "avg_over_time": true, "label_values": true,
	"and": true, "or": true, "unless": true, "offset": true, "bool": true, "group_left": true, "group_right": true,
	"by": true, "without": true, "on": true, "ignoring": true, "abs": true, "clamp_min": true, "clamp_max": true,
}

// metricNames returns the metric names expression q reads.
func metricNames(t *testing.T, q string) []string {
	t.Helper()
	q = regexp.MustCompile(`"[^"]*"`).ReplaceAllString(q, `""`)                                                    // strings
	q = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(q, "")                                                    // label matchers
	q = regexp.MustCompile(`\[[^\]]*\]`).ReplaceAllString(q, "")                                                   // ranges
	q = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right) *\([^)]*\)`).ReplaceAllString(q, "") // grouping
	q = regexp.MustCompile(`\boffset +[0-9a-z]+`).ReplaceAllString(q, "")
	var names []string
	for _, w := range regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`).FindAllString(q, -1) {
		if !promqlWords[w] && !regexp.MustCompile(`^[0-9]`).MatchString(w) {
			names = append(names, w)
		}
	}
	return names
}

// startPrometheusFor runs a Prometheus server that scrapes the node's
// HTTP address every second as job "kvstrata" and evaluates the alerting
// rules every second, and returns its URL.
func startPrometheusFor(t *testing.T, target string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("no prometheus binary (Debian package prometheus)")
	}
	rules, err := filepath.Abs(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: kvstrata
    static_configs: [{targets: [%q]}]
`, rules, target), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeport.Addr(t)
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	u := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get(u + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return u
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30 s:\n%s", log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// query runs an instant query and returns its result's series.
func query(prom, q string) ([]json.RawMessage, error) {
	resp, err := http.Get(prom + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r struct {
		Status, Error string
		Data          struct {
			ResultType string
			Result     json.RawMessage
		}
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", b, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s", r.Error)
	}
	if r.Data.ResultType == "scalar" {
		return []json.RawMessage{r.Data.Result}, nil
	}
	var series []json.RawMessage
	err = json.Unmarshal(r.Data.Result, &series)
	return series, err
}

// waitQuery waits until q returns data.
func waitQuery(t *testing.T, prom, q string) {
	t.Helper()
	eventually(t, 60*time.Second, "prometheus answers "+q, func() bool {
		res, err := query(prom, q)
		return err == nil && len(res) > 0
	})
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// TestClusterMetricsAgreeAndCountADownMember: in a three-node cluster
// every node names the same leader and term, exactly one says it leads,
// the members read three up; once a follower is killed, the others count
// it down.
func TestClusterMetricsAgreeAndCountADownMember(t *testing.T) {
	nodes := startCluster(t, loopback(3))
	leader := leaderOf(t, nodes...)
	leaders := 0.0
	for i, p := range nodes {
		v := gauges(t, p)
		leaders += v["kvstrata_raft_is_leader"]
		if v["kvstrata_raft_leader_id"] != float64(leader) || v["kvstrata_raft_term"] < 1 || v["kvstrata_raft_commit_index"] < 1 ||
			v["kvstrata_raft_applied_index"] < 1 {
			t.Errorf("node %d: leader %v term %v commit %v applied %v, want leader %d and indices past 0", i+1,
				v["kvstrata_raft_leader_id"], v["kvstrata_raft_term"], v["kvstrata_raft_commit_index"], v["kvstrata_raft_applied_index"], leader)
		}
		if v[`kvstrata_cluster_members{liveness="up"}`] != 3 || v[`kvstrata_cluster_members{liveness="down"}`] != 0 {
			t.Errorf("node %d counts %v members up and %v down, want 3 and 0", i+1,
				v[`kvstrata_cluster_members{liveness="up"}`], v[`kvstrata_cluster_members{liveness="down"}`])
		}
	}
	if leaders != 1 {
		t.Errorf("%v nodes say they lead, want 1", leaders)
	}
	victim := nodes[0]
	if leader == 1 {
		victim = nodes[1]
	}
	victim.kill()
	for _, p := range nodes {
		if p == victim {
			continue
		}
		eventually(t, 30*time.Second, "a survivor counts the killed follower down", func() bool {
			v := gauges(t, p)
			return v[`kvstrata_cluster_members{liveness="down"}`] == 1 && v[`kvstrata_cluster_members{liveness="up"}`] == 2 &&
				v["kvstrata_raft_leader_id"] == float64(leader)
		})
	}
}

// gauges scrapes the node's /metrics: each series' value by its name and
// labels as /metrics writes them.
func gauges(t *testing.T, p *proc) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	v := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); line != "" && line[0] != '#' {
			i := strings.LastIndexByte(line, ' ')
			var f float64
			if _, err := fmt.Sscan(line[i+1:], &f); err == nil {
				v[line[:i]] = f
			}
		}
	}
	return v
}
