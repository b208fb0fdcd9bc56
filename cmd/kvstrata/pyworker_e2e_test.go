package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/internal/freeport"
)

// Interop with a worker that is not ours: testdata/pyworker.py, a small
// vLLM-like server in Python (stdlib HTTP, pyzmq, msgpack) that publishes
// its block pool's KV events in vLLM's wire format, hashing its blocks
// with sha256. The frontend must route to it by those events alone.

// needPyworker returns a Python interpreter with the zmq and msgpack
// modules — the first python3 on PATH, or Debian's, which python3-zmq
// and python3-msgpack install into — or skips the test.
func needPyworker(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import zmq, msgpack").Run() == nil {
			return py
		}
	}
	t.Skip("python3 with zmq and msgpack is missing (apt-get install -y python3 python3-zmq python3-msgpack): skipping the Python worker interop test")
	return ""
}

// pyWorker is a running testdata/pyworker.py.
type pyWorker struct {
	t      *testing.T
	url    string
	replay string // its replay socket
	log    *syncBuffer
	exited chan error
}

// startPyworker starts pyworker.py with args (and an HTTP port and a
// replay socket of its own) and waits until /health answers.
func startPyworker(t *testing.T, py string, args ...string) *pyWorker {
	t.Helper()
	listen := freeport.Addr(t)
	w := &pyWorker{t: t, url: "http://" + listen, replay: "tcp://" + freeport.Addr(t), log: &syncBuffer{}, exited: make(chan error, 1)}
	cmd := exec.Command(py, append([]string{"testdata/pyworker.py", "--listen", listen, "--kv-events-replay", w.replay}, args...)...)
	cmd.Stdout, cmd.Stderr = w.log, w.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-w.exited
		if t.Failed() {
			t.Logf("pyworker %s:\n%s", w.url, w.log)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get(w.url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return w
			}
		}
		select {
		case err := <-w.exited:
			t.Fatalf("pyworker exited while starting: %v\n%s", err, w.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pyworker not healthy after 30s:\n%s", w.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stats is the worker's /admin/stats: requests served, blocks held,
// event batches published.
func (w *pyWorker) stats() (requests, blocks, published int) {
	w.t.Helper()
	resp, err := http.Get(w.url + "/admin/stats")
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Requests, Blocks, Published int }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		w.t.Fatal(err)
	}
	return st.Requests, st.Blocks, st.Published
}

// post POSTs body (JSON) to url and fails the test unless it answers 200.
func post(t *testing.T, url string, body any) []byte {
	t.Helper()
	j, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(j))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	out.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s: %s", url, resp.Status, out.String())
	}
	return out.Bytes()
}

// promptOf is a prompt of n token ids, distinct for each seed, within the
// vocabulary.
func promptOf(seed, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = 2000 + seed*n + i
	}
	return p
}

// pyFrontend is `kvstrata frontend` over Python workers.
type pyFrontend struct {
	t   *testing.T
	p   *proc
	url string
	ws  []*pyWorker
}

// routed sends prompt through the frontend, streamed, checks the answer,
// and returns the index of the worker that served it (the one whose
// request count grew).
func (f *pyFrontend) routed(prompt []int) int {
	f.t.Helper()
	var before []int
	for _, w := range f.ws {
		n, _, _ := w.stats()
		before = append(before, n)
	}
	body := post(f.t, f.url+"/v1/completions", map[string]any{"model": "kvstrata-sim", "prompt": prompt, "max_tokens": 4, "stream": true})
	sc := bufio.NewScanner(bytes.NewReader(body))
	chunks, done := 0, false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case data == "[DONE]":
			done = true
		default:
			chunks++
		}
	}
	if chunks == 0 || !done {
		f.t.Fatalf("the frontend's stream: %d chunks, [DONE] %v:\n%s", chunks, done, body)
	}
	got := -1
	for i, w := range f.ws {
		if n, _, _ := w.stats(); n != before[i] {
			if got >= 0 {
				f.t.Fatal("one request reached two workers")
			}
			got = i
		}
	}
	if got < 0 {
		f.t.Fatal("the request reached no worker")
	}
	return got
}

// batches is how many of worker i's event batches the frontend has
// applied, from its /metrics.
func (f *pyFrontend) batches(i int) int {
	f.t.Helper()
	return int(f.metric(fmt.Sprintf("kvstrata_frontend_kv_event_batches_total{worker=%q}", f.ws[i].url)))
}

// metric is the value of the series (name{labels}) on the frontend's
// /metrics.
func (f *pyFrontend) metric(series string) float64 {
	f.t.Helper()
	resp, err := http.Get(f.url + "/metrics")
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				f.t.Fatal(err)
			}
			return n
		}
	}
	f.t.Fatalf("/metrics has no %s", series)
	return 0
}

// hostileConn connects to addr, sends stream, and waits for the other
// side to close the connection.
func hostileConn(t *testing.T, addr string, stream []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go c.Write(stream) // the peer may close midway
	if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the connection was not closed before its 30 s deadline: %v", err)
	}
}

// caughtUp waits until the frontend has applied every batch worker i
// published.
func (f *pyFrontend) caughtUp(i int) {
	f.t.Helper()
	eventually(f.t, 20*time.Second, fmt.Sprintf("the frontend applies worker %d's batches", i), func() bool {
		_, _, published := f.ws[i].stats()
		return f.batches(i) >= published
	})
}

// TestPythonWorkersRoutedByTheirEvents: two Python workers that are not
// ours, behind `kvstrata frontend`, with their events in both of vLLM's
// encodings and both hash forms, heard in connect mode (the frontend dials
// each worker's PUB socket) and in bind mode (each worker's PUB socket
// connects to the frontend's, as vLLM's does for an endpoint that is not
// a wildcard, and is told apart by its topic). A prompt run on the second
// worker, and its first half on the first, makes the frontend send that
// prefix to the second; after the second clears its pool
// (AllBlocksCleared), to the first. In bind mode, garbage and a forged
// frame length sent to the frontend's listening socket first only close
// their own connections.
func TestPythonWorkersRoutedByTheirEvents(t *testing.T) {
	py := needPyworker(t)
	for _, mode := range []string{"connect", "bind"} {
		t.Run(mode, func(t *testing.T) {
			formats := [][]string{{"--encoding", "arrays", "--hash", "bytes"}, {"--encoding", "maps", "--hash", "int"}}
			if mode == "bind" {
				formats[0][1], formats[1][1] = "maps", "arrays"
			}
			f := &pyFrontend{t: t}
			fp := &proc{t: t, http: freeport.Addr(t)}
			fp.args = []string{"frontend", "--listen", fp.http, "--cache", "", "--health-interval", "200ms"}
			bind := "tcp://" + freeport.Addr(t)
			if mode == "bind" {
				fp.args = append(fp.args, "--kv-events-bind", bind)
			}
			for i, format := range formats {
				var w *pyWorker
				if mode == "connect" {
					events := "tcp://" + freeport.Addr(t)
					w = startPyworker(t, py, append([]string{"--kv-events", events, "--kv-events-mode", "bind"}, format...)...)
					fp.args = append(fp.args, "--worker", fmt.Sprintf("%s,events=%s,replay=%s", w.url, events, w.replay))
				} else {
					// vLLM's rule: an endpoint without a wildcard connects.
					topic := fmt.Sprintf("pyworker-%d", i)
					w = startPyworker(t, py, append([]string{"--kv-events", bind, "--kv-events-topic", topic}, format...)...)
					fp.args = append(fp.args, "--worker", fmt.Sprintf("%s,topic=%s,replay=%s", w.url, topic, w.replay))
				}
				f.ws = append(f.ws, w)
			}
			fp.launch()
			f.p, f.url = fp, "http://"+fp.http
			waitWorkerHealth(t, fp, f.url)
			if mode == "bind" {
				// The bound socket faces the network: garbage, and a
				// frame header announcing 2^63-1 bytes, close their
				// connections and harm nothing.
				addr := strings.TrimPrefix(bind, "tcp://")
				garbage := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 1024)
				greeting := append(append([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0}, "NULL"...), make([]byte, 48)...)
				huge := append(greeting, 0x06, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
				for _, stream := range [][]byte{garbage, huge} {
					hostileConn(t, addr, stream)
				}
				eventually(t, 20*time.Second, "the frontend counts the hostile connections", func() bool {
					return f.metric(`kvstrata_frontend_kv_event_listener_closed_connections_total{reason="bad_peer"}`) == 2
				})
			}

			// Until the frontend hears a worker, it knows nothing of its
			// pool: warm each up directly with new prompts until a batch
			// of its reaches the frontend (those it missed are replayed).
			for i, w := range f.ws {
				k := 0
				eventually(t, 20*time.Second, fmt.Sprintf("the frontend hears worker %d", i), func() bool {
					k++
					post(t, w.url+"/v1/completions", map[string]any{"prompt": promptOf(100+10*i+k, 32), "max_tokens": 1})
					time.Sleep(20 * time.Millisecond)
					return f.batches(i) > 0
				})
				f.caughtUp(i)
			}

			// A prompt run on worker 1, and its first half on worker 0, not
			// through the frontend: the frontend learns where they are
			// from the workers' events alone.
			prefix := promptOf(1, 256)
			post(t, f.ws[1].url+"/v1/completions", map[string]any{"prompt": prefix, "max_tokens": 1})
			post(t, f.ws[0].url+"/v1/completions", map[string]any{"prompt": prefix[:128], "max_tokens": 1})
			f.caughtUp(0)
			f.caughtUp(1)
			if _, blocks, _ := f.ws[1].stats(); blocks < 16 {
				t.Fatalf("worker 1 holds %d blocks, want the prefix's 16 at least", blocks)
			}
			for k := range 3 {
				if got := f.routed(append(append([]int{}, prefix...), promptOf(10+k, 20)...)); got != 1 {
					t.Fatalf("request %d sharing worker 1's prefix went to worker %d", k, got)
				}
			}
			// And the converse: a prefix of worker 0's goes to worker 0.
			other := promptOf(2, 256)
			post(t, f.ws[0].url+"/v1/completions", map[string]any{"prompt": other, "max_tokens": 1})
			f.caughtUp(0)
			if got := f.routed(append(append([]int{}, other...), promptOf(20, 20)...)); got != 0 {
				t.Fatalf("a request sharing worker 0's prefix went to worker %d", got)
			}

			// Worker 1 clears its pool: once the frontend has applied
			// that, worker 0's half of the prefix is the longest.
			post(t, f.ws[1].url+"/admin/clear", map[string]any{})
			f.caughtUp(1)
			if got := f.routed(append(append([]int{}, prefix...), promptOf(30, 20)...)); got != 0 {
				t.Fatalf("after worker 1's AllBlocksCleared, its old prefix went to worker %d, want 0", got)
			}
		})
	}
}

// TestFrontendEventsFlagsExitTwo: a worker named by topic needs
// --kv-events-bind, two such workers need distinct topics, and
// --kv-events-bind must be an endpoint.
func TestFrontendEventsFlagsExitTwo(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"frontend", "--worker", "http://127.0.0.1:1,topic=a"}, []string{"has a topic but no events endpoint"}},
		{[]string{"frontend", "--kv-events-bind", "127.0.0.1:5557", "--worker", "http://127.0.0.1:1,topic=a", "--worker", "http://127.0.0.1:2,topic=a"},
			[]string{`events bind "127.0.0.1:5557"`, `both publish on topic "a"`}},
	} {
		usageErrorSays(t, c.args, c.want...)
	}
}

// TestWorkersPublishIntoABindModeFrontend: `kvstrata worker
// --kv-events-connect --kv-events-topic T` publishes into a frontend's
// --kv-events-bind socket, and the frontend applies each worker's batches
// as that worker's.
func TestWorkersPublishIntoABindModeFrontend(t *testing.T) {
	bind := "tcp://" + freeport.Addr(t)
	f := &pyFrontend{t: t}
	fp := &proc{t: t, http: freeport.Addr(t)}
	fp.args = []string{"frontend", "--listen", fp.http, "--cache", "", "--health-interval", "200ms", "--kv-events-bind", bind}
	var ws []*wproc
	for i := range 2 {
		topic := fmt.Sprintf("kvstrata-%d", i)
		w := startWorkerProcess(t, "", "--kv-events", bind, "--kv-events-connect", "--kv-events-topic", topic)
		ws = append(ws, w)
		fp.args = append(fp.args, "--worker", fmt.Sprintf("%s,topic=%s,replay=%s", w.url, topic, w.replay))
		f.ws = append(f.ws, &pyWorker{t: t, url: w.url}) // for batches' label
	}
	fp.launch()
	f.p, f.url = fp, "http://"+fp.http
	waitWorkerHealth(t, fp, f.url)
	for i, w := range ws {
		k := 0
		eventually(t, 20*time.Second, fmt.Sprintf("the frontend applies worker %d's batches", i), func() bool {
			k++
			post(t, w.url+"/v1/completions", map[string]any{"prompt": promptOf(200+10*i+k, 32), "max_tokens": 1})
			time.Sleep(20 * time.Millisecond)
			return f.batches(i) > 0
		})
	}
	if n := f.metric(`kvstrata_frontend_kv_event_listener_messages_total{outcome="unknown_topic"}`); n != 0 {
		t.Errorf("%v messages of unknown topics", n)
	}
}
