package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

// The end-to-end tests run the real kvstrata binary, built once by
// TestMain, on free loopback ports, and drive it with the Go client,
// redis-cli and redis-benchmark.

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvstrata-e2e")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "kvstrata")
	if out, err := exec.Command("go", "build", "-race", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building kvstrata: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running kvstrata serve.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	dir    string
	prefix []string // runs the binary, e.g. in a network namespace
	args   []string
	log    *syncBuffer
	grpc   string
	resp   string
	http   string
	exited chan error
	cl     *client.Client // api's
	// tls, when set, is how the test reaches a node that speaks TLS: its
	// HTTP, and the clients api and client dial.
	tls *tls.Config
}

// startNode starts kvstrata serve in dir with extra flags and waits until
// it is ready.
func startNode(t *testing.T, dir string, extra ...string) *proc {
	t.Helper()
	p := &proc{t: t, dir: dir, grpc: freeport.Addr(t), resp: freeport.Addr(t), http: freeport.Addr(t)}
	p.args = append([]string{"serve", "--data-dir", dir, "--dram-capacity", "64MiB", "--ssd-capacity", "512MiB",
		"--listen-grpc", p.grpc, "--listen-data", freeport.Addr(t), "--listen-resp", p.resp, "--listen-http", p.http,
		"--cluster-raft-addr", freeport.Addr(t)}, extra...)
	p.start()
	return p
}

func (p *proc) start() {
	p.t.Helper()
	p.launch()
	p.waitReady()
}

// launch starts the process without waiting for it.
func (p *proc) launch() {
	p.t.Helper()
	p.log = &syncBuffer{}
	argv := append(append(slices.Clone(p.prefix), binary), p.args...)
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.exited = make(chan error, 1)
	go func() { p.exited <- p.cmd.Wait() }()
	p.t.Cleanup(func() {
		p.kill()
		if p.t.Failed() {
			p.t.Logf("the log of kvstrata %s:\n%s", strings.Join(p.args, " "), p.log)
		}
	})
}

// waitReady waits until /readyz answers OK.
func (p *proc) waitReady() {
	p.t.Helper()
	p.waitOK("ready", 20*time.Second, func() (*http.Response, error) { return p.httpGet("/readyz") })
}

// waitOK waits until get answers 200 OK, at most within; it fails the
// test, with the process's log, if the process exits first or the time
// runs out.
func (p *proc) waitOK(what string, within time.Duration, get func() (*http.Response, error)) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := get()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-p.exited:
			p.t.Fatalf("kvstrata exited before it was %s: %v\n%s", what, err, p.log)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("kvstrata not %s after %v:\n%s", what, within, p.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpGet gets path from the node's HTTP server, over TLS when the node
// speaks it.
func (p *proc) httpGet(path string) (*http.Response, error) {
	if p.tls == nil {
		return http.Get("http://" + p.http + path)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: p.tls}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	return hc.Get("https://" + p.http + path)
}

// kill sends SIGKILL and waits for the process.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		if err != nil {
			p.t.Fatalf("kvstrata exited with %v after SIGTERM:\n%s", err, p.log)
		}
	case <-time.After(30 * time.Second):
		p.t.Fatalf("kvstrata still running 30s after SIGTERM:\n%s", p.log)
	}
}

// restart starts the node again with the same flags, data and ports.
func (p *proc) restart() {
	p.t.Helper()
	p.start()
}

func (p *proc) client(opts client.Options) *client.Client {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if opts.TLS == nil {
		opts.TLS = p.tls
	}
	c, err := client.Dial(ctx, p.grpc, opts)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { c.Close() })
	return c
}

// api returns a client of the node, dialled on first use; it reconnects
// to a restarted node by itself.
func (p *proc) api() *client.Client {
	p.t.Helper()
	if p.cl == nil {
		p.cl = p.client(client.Options{})
	}
	return p.cl
}

// syncBuffer is a bytes.Buffer safe for a process's two output streams.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// blockData is the deterministic content of block i.
func blockData(i, size int) []byte {
	b := make([]byte, size)
	for j := range b {
		b[j] = byte(i*31 + j*7 + j>>9)
	}
	return b
}

func putBlocks(t *testing.T, c *client.Client, ns index.NamespaceID, from, to, size int) []index.Key {
	t.Helper()
	var blocks []client.Block
	for i := from; i < to; i++ {
		blocks = append(blocks, client.Block{Key: index.Key{NS: ns, Hash: index.Hash(i)}, Data: blockData(i, size)})
	}
	if err := c.Put(context.Background(), blocks); err != nil {
		t.Fatal(err)
	}
	keys := make([]index.Key, len(blocks))
	for i, b := range blocks {
		keys[i] = b.Key
	}
	return keys
}

// checkIntactOrMissing fetches keys and fails on any block whose bytes are
// not exactly what was put; it returns how many were found.
func checkIntactOrMissing(t *testing.T, c *client.Client, keys []index.Key, size int) (found int, foundKeys map[index.Key]bool) {
	t.Helper()
	foundKeys = map[index.Key]bool{}
	res, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Found {
			continue
		}
		if !bytes.Equal(r.Data, blockData(int(keys[i].Hash), size)) {
			t.Fatalf("block %v came back corrupt", keys[i])
		}
		found++
		foundKeys[keys[i]] = true
	}
	return found, foundKeys
}

func TestServeStoresAndReturnsBlocksOverBothPaths(t *testing.T) {
	p := startNode(t, t.TempDir())
	for _, opts := range []client.Options{{}, {NoDataPlane: true}} {
		c := p.client(opts)
		ns := index.NamespaceID(len(c.DataPlane()))
		keys := putBlocks(t, c, ns, 0, 40, 256<<10)
		if n, _ := checkIntactOrMissing(t, c, keys, 256<<10); n != 40 {
			t.Fatalf("%s: %d of 40 blocks found", c.DataPlane(), n)
		}
	}
	st, err := p.client(client.Options{}).Stats(context.Background())
	if err != nil || st.Keys != 80 || st.Node.Transport != "tcp" || st.Node.RespAddr != p.resp {
		t.Fatalf("stats %v %v", st, err)
	}
}

// A second node started on a data or SSD directory a node runs on is
// refused at once, saying which process holds it; the first serves on.
func TestASecondNodeOnTheSameDirectoriesIsRefused(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, dir)
	ssd := filepath.Join(dir, "ssd")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--data-dir", dir}, fmt.Sprintf("directory %s is in use by process %d: give each node its own --data-dir", dir, p.cmd.Process.Pid)},
		{[]string{"--data-dir", t.TempDir(), "--ssd-dir", ssd}, fmt.Sprintf("directory %s is in use by process %d: give each node its own --ssd-dir", ssd, p.cmd.Process.Pid)},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		args := append([]string{"serve", "--listen-grpc", freeport.Addr(t), "--listen-data", freeport.Addr(t),
			"--listen-resp", freeport.Addr(t), "--listen-http", freeport.Addr(t), "--cluster-raft-addr", freeport.Addr(t)}, c.args...)
		out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
		cancel()
		if _, exited := err.(*exec.ExitError); !exited || !strings.Contains(string(out), c.want) {
			t.Fatalf("a second serve %v: %v, want an exit saying %q:\n%s", c.args, err, c.want, out)
		}
	}
	c := p.api()
	keys := putBlocks(t, c, 1, 0, 4, 4096)
	if n, _ := checkIntactOrMissing(t, c, keys, 4096); n != 4 {
		t.Fatalf("the first node holds %d of 4 blocks put after the refusal", n)
	}
}

func TestSIGTERMThenRestartFindsEverySSDBlock(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, dir, "--dram-capacity", "8MiB")
	c := p.client(client.Options{})
	keys := putBlocks(t, c, 1, 0, 64, 1<<20) // 64 MiB into 8 MiB of DRAM: most go to the SSD
	st, _ := c.Stats(context.Background())
	ssdBlocks := st.Tiers[1].Blocks
	if ssdBlocks < 50 {
		t.Fatalf("only %d blocks demoted to the ssd", ssdBlocks)
	}
	c.Close()
	p.stop()
	if !strings.Contains(p.log.String(), "msg=stopped") {
		t.Fatalf("no clean stop in the log:\n%s", p.log)
	}
	p.restart()
	c = p.client(client.Options{})
	st, _ = c.Stats(context.Background())
	// The mover may have demoted more between the stats and the stop.
	if st.Tiers[1].Blocks < ssdBlocks {
		t.Fatalf("ssd held %d blocks before the restart, %d after", ssdBlocks, st.Tiers[1].Blocks)
	}
	if n, _ := checkIntactOrMissing(t, c, keys, 1<<20); n != int(st.Tiers[1].Blocks) {
		t.Fatalf("%d blocks back after a clean restart, the ssd holds %d", n, st.Tiers[1].Blocks)
	}
}

func TestKill9ThenRestartReturnsSSDBlocksIntact(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, dir, "--dram-capacity", "8MiB")
	c := p.client(client.Options{})
	keys := putBlocks(t, c, 1, 0, 48, 1<<20)
	var onSSD []index.Key
	for _, k := range keys {
		lr, err := c.Lookup(context.Background(), k.NS, []index.Hash{k.Hash})
		if err != nil {
			t.Fatal(err)
		}
		for _, tb := range lr.Tiers {
			if tb.Tier == "ssd" && tb.Blocks == 1 {
				onSSD = append(onSSD, k)
			}
		}
	}
	if len(onSSD) < 30 {
		t.Fatalf("only %d blocks on the ssd", len(onSSD))
	}
	// Blocks demoted to the SSD more than a flush interval (1s) before the
	// kill are on disk once that flush is done: give it time even on a
	// loaded machine, where a flush under the race detector takes seconds.
	time.Sleep(5 * time.Second)
	// Keep writing while the node is killed.
	stopWriting := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		w := p.client(client.Options{MaxRetries: -1})
		for i := 1000; ; i++ {
			select {
			case <-stopWriting:
				return
			default:
			}
			_ = w.Put(context.Background(), []client.Block{{Key: index.Key{NS: 2, Hash: index.Hash(i)}, Data: blockData(i, 1<<20)}})
		}
	})
	time.Sleep(300 * time.Millisecond)
	p.kill()
	close(stopWriting)
	wg.Wait()

	p.restart()
	c = p.client(client.Options{})
	_, found := checkIntactOrMissing(t, c, keys, 1<<20)
	for _, k := range onSSD {
		if !found[k] {
			t.Errorf("block %v was on the ssd for 5s before the kill and is gone", k)
		}
	}
	var during []index.Key
	for i := 1000; i < 1400; i++ {
		during = append(during, index.Key{NS: 2, Hash: index.Hash(i)})
	}
	n, _ := checkIntactOrMissing(t, c, during, 1<<20) // never corrupt
	t.Logf("%d blocks were on the ssd; %d blocks written during the kill survived", len(onSSD), n)
}

func TestRedisCLIWorksUnchanged(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli not installed (Debian package redis-tools)")
	}
	p := startNode(t, t.TempDir())
	host, port, _ := net.SplitHostPort(p.resp)
	run := func(args ...string) string {
		out, err := exec.Command(cli, append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"PING"}, "PONG"},
		{[]string{"SET", "prompt:1", "hello kv"}, "OK"},
		{[]string{"GET", "prompt:1"}, "hello kv"},
		{[]string{"MSET", "a", "1", "b", "2"}, "OK"},
		{[]string{"MGET", "a", "b", "nope"}, "1\n2"},
		{[]string{"EXISTS", "a", "b", "nope"}, "2"},
		{[]string{"DEL", "a", "nope"}, "1"},
		{[]string{"DBSIZE"}, "2"},
		{[]string{"SELECT", "0"}, "OK"},
		{[]string{"TYPE", "prompt:1"}, "string"},
	} {
		if got := run(c.args...); !strings.Contains(got, c.want) {
			t.Errorf("redis-cli %v = %q, want %q", c.args, got, c.want)
		}
	}
	if info := run("INFO"); !strings.Contains(info, "redis_version:") || !strings.Contains(info, "dram_used_bytes:") {
		t.Errorf("INFO lacks server or tier fields:\n%s", info)
	}
	// The value went through the tiers: the node's own stats count it.
	st, _ := p.client(client.Options{}).Stats(context.Background())
	if st.Keys != 2 {
		t.Fatalf("node holds %d blocks, want the 2 keys left", st.Keys)
	}
}

func TestRedisBenchmarkWorksUnchanged(t *testing.T) {
	rb, err := exec.LookPath("redis-benchmark")
	if err != nil {
		t.Skip("redis-benchmark not installed (Debian package redis-tools)")
	}
	p := startNode(t, t.TempDir())
	host, port, _ := net.SplitHostPort(p.resp)
	for _, extra := range [][]string{{"-d", "65536"}, {"-d", "1048576", "-n", "100"}, {"-d", "1024", "-P", "16"}} {
		args := append([]string{"-h", host, "-p", port, "-t", "set,get", "-n", "500", "-c", "4", "-q"}, extra...)
		out, err := exec.Command(rb, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-benchmark %v: %v\n%s", extra, err, out)
		}
		for _, op := range []string{"SET: ", "GET: "} {
			if !strings.Contains(string(out), op) || !strings.Contains(string(out), "requests per second") {
				t.Fatalf("redis-benchmark %v printed no %s rate:\n%s", extra, op, out)
			}
		}
	}
}

// usageErrorSays runs the binary with args and checks that it exits with
// status 2, a usage error, and that its output says each of want.
func usageErrorSays(t *testing.T, args []string, want ...string) {
	t.Helper()
	out, err := exec.Command(binary, args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("%v: exit %v, want status 2:\n%s", args, err, out)
		return
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Errorf("%v: the output does not say %q:\n%s", args, w, out)
		}
	}
}

func TestBadConfigurationExitsWithEveryProblem(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "kvstrata.toml")
	os.WriteFile(cfg, []byte("[dram]\npolicy = \"mru\"\n"), 0o644)
	cmd := exec.Command(binary, "serve", "--config", cfg, "--dram-capacity", "lots", "--listen-grpc", "nowhere")
	cmd.Env = append(os.Environ(), "KVSTRATA_SSD_ADMIT_MIN_SEEN=0")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want status 2:\n%s", err, out)
	}
	for _, want := range []string{`dram.policy "mru" is unknown`, `flag --dram-capacity: dram.capacity: size "lots"`,
		`listen.grpc "nowhere" is not host:port`, `ssd.admit-min-seen 0 outside [1, 15]`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
}

func TestPrintConfigShowsSources(t *testing.T) {
	cmd := exec.Command(binary, "serve", "--print-config", "--data-dir", t.TempDir(), "--dram-policy", "prefix")
	cmd.Env = append(os.Environ(), "KVSTRATA_DRAM_CAPACITY=1GiB")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	want := map[string]string{`capacity = "1GiB"`: "env KVSTRATA_DRAM_CAPACITY", `policy = "prefix"`: "flag --dram-policy"}
	for sc.Scan() {
		for k, src := range want {
			if strings.HasPrefix(sc.Text(), k) && strings.HasSuffix(sc.Text(), src) {
				delete(want, k)
			}
		}
	}
	if len(want) > 0 {
		t.Fatalf("missing %v in:\n%s", want, out)
	}
}

func TestMetricsPassPromtoolAndHealthEndpointsAnswer(t *testing.T) {
	p := startNode(t, t.TempDir())
	c := p.client(client.Options{})
	keys := putBlocks(t, c, 1, 0, 4, 4096)
	_, _ = c.Get(context.Background(), keys)
	// The server counts a block sent once it releases the block, a moment
	// after the client has it.
	var body []byte
	for try := 0; try < 50 && !bytes.Contains(body, []byte(`api="data",op="get"`)); try++ {
		time.Sleep(20 * time.Millisecond)
		resp, err := http.Get("http://" + p.http + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	for _, want := range []string{`kvstrata_tier_used_bytes{tier="dram"} 16384`, `kvstrata_tier_hits_total{tier="dram"} 4`,
		`kvstrata_data_plane_bytes_total{direction="in"} 16384`, `kvstrata_request_duration_seconds_bucket{api="data",op="get"`,
		`kvstrata_request_duration_seconds_count{api="grpc",op="info",status="ok"}`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		r, err := http.Get("http://" + p.http + path)
		if err != nil || r.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v", path, r, err)
		}
		r.Body.Close()
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}
