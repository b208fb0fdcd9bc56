package openai

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The HTTP server probed as an attacker would: real sockets, raw bytes.

// startGuarded serves e as a worker does: on a real listener, through
// HTTPServer, within lim.
func startGuarded(t *testing.T, e *testEngine, lim Limits) (*Server, string) {
	t.Helper()
	cfg := Config{Engine: e, Tokenizer: byteTok{}, ModelName: testModel, ContextLen: 1 << 20, StopTokens: []uint32{eosID},
		Limits: lim, Logger: slog.New(slog.DiscardHandler)}
	e.contextLen = cfg.ContextLen
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, guarded := s.HTTPServer(ln)
	go srv.Serve(guarded)
	t.Cleanup(func() { srv.Close() })
	return s, ln.Addr().String()
}

// stalledPOST announces an 8 MB completions body and sends a few bytes.
const stalledPOST = "POST /v1/completions HTTP/1.1\r\nHost: worker\r\nContent-Type: application/json\r\nContent-Length: 8000000\r\n\r\n{\"prompt\":"

// dialRaw connects and sends part; the test's end closes the connection.
func dialRaw(t *testing.T, addr, part string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if part != "" {
		if _, err := io.WriteString(nc, part); err != nil {
			t.Fatal(err)
		}
	}
	return nc
}

// answer reads one response from nc before deadline, and its body.
func answer(nc net.Conn, br *bufio.Reader, deadline time.Time) (*http.Response, string, error) {
	nc.SetReadDeadline(deadline)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

// closedByServer reports whether the server closes nc before deadline.
func closedByServer(nc net.Conn, br *bufio.Reader, deadline time.Time) error {
	nc.SetReadDeadline(deadline)
	b, err := br.ReadByte()
	switch {
	case err == nil:
		return fmt.Errorf("the server sent more: %q", b)
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), strings.Contains(err.Error(), "connection reset"):
		return nil
	default:
		return err
	}
}

// A client that sends its headers and a few bytes of an 8 MB body, then
// nothing, is told 408 once its body's time is up and disconnected; the
// engine never sees its request.
func TestStalledBodyIsCutAndNeverReachesTheEngine(t *testing.T) {
	e := &testEngine{}
	_, addr := startGuarded(t, e, Limits{BodyTimeout: 300 * time.Millisecond, MinBodyRate: 1000})
	nc := dialRaw(t, addr, stalledPOST)
	br := bufio.NewReader(nc)
	resp, body, err := answer(nc, br, time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatalf("a stalled body was not answered before the 10 s deadline: %v", err)
	}
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
		t.Fatalf("a stalled body got %d (close %v) %s, want 408 and the connection closed", resp.StatusCode, resp.Close, body)
	}
	if msg := errorOf(t, body).Message; !strings.Contains(msg, "not received in time") {
		t.Errorf("the 408 says %q", msg)
	}
	if err := closedByServer(nc, br, time.Now().Add(10*time.Second)); err != nil {
		t.Errorf("the connection was not closed after the 408: %v", err)
	}
	if reqs := e.requests(); len(reqs) != 0 {
		t.Errorf("the engine saw %d requests", len(reqs))
	}
}

// A body trickling in slower than MinBodyRate is cut when its allowance
// runs out, though no gap between bytes is long.
func TestTricklingBodyIsCutByItsRate(t *testing.T) {
	_, addr := startGuarded(t, &testEngine{}, Limits{BodyTimeout: 300 * time.Millisecond, MinBodyRate: 1000})
	nc := dialRaw(t, addr, stalledPOST)
	got := make(chan *http.Response, 1)
	go func() {
		resp, _, _ := answer(nc, bufio.NewReader(nc), time.Now().Add(time.Minute))
		got <- resp
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	giveUp := time.After(10 * time.Second)
	for {
		select {
		case resp := <-got:
			if resp == nil || resp.StatusCode != http.StatusRequestTimeout {
				t.Fatalf("the trickling client got %v, want a 408", resp)
			}
			return
		case <-tick.C:
			nc.Write([]byte(" ")) // 20 bytes/s: each gap short, the rate far too low
		case <-giveUp:
			t.Fatal("a body trickling in at 20 bytes/s is still being read after 10 s")
		}
	}
}

// A body that arrives at a good pace is read whole, however long it takes
// past BodyTimeout.
func TestSteadyBodyOutlivesBodyTimeout(t *testing.T) {
	e := &testEngine{}
	_, addr := startGuarded(t, e, Limits{BodyTimeout: 200 * time.Millisecond, MinBodyRate: 16 << 10})
	body := `{"prompt":"steady","max_tokens":3,"pad":"` + strings.Repeat(" ", 256<<10) + `"}`
	nc := dialRaw(t, addr, fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: worker\r\nContent-Length: %d\r\n\r\n", len(body)))
	for i := 0; i < len(body); i += 16 << 10 { // 160 KiB/s for 1.6 s: ten times the minimum
		if _, err := io.WriteString(nc, body[i:min(i+16<<10, len(body))]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	resp, answerBody, err := answer(nc, bufio.NewReader(nc), time.Now().Add(10*time.Second))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a body sent at ten times MinBodyRate: %v %v %s", resp, err, answerBody)
	}
}

// A keep-alive connection that starts no new request is closed after
// IdleTimeout.
func TestIdleConnectionIsClosed(t *testing.T) {
	_, addr := startGuarded(t, &testEngine{}, Limits{IdleTimeout: 200 * time.Millisecond})
	nc := dialRaw(t, addr, "GET /health HTTP/1.1\r\nHost: worker\r\n\r\n")
	br := bufio.NewReader(nc)
	resp, _, err := answer(nc, br, time.Now().Add(10*time.Second))
	if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /health: %v %v, want 200 on a kept-alive connection", resp, err)
	}
	if err := closedByServer(nc, br, time.Now().Add(10*time.Second)); err != nil {
		t.Fatalf("an idle connection is still open 10 s after its 200 ms IdleTimeout: %v", err)
	}
}

// Headers over MaxHeaderBytes are answered 431.
func TestHugeHeadersAre431(t *testing.T) {
	_, addr := startGuarded(t, &testEngine{}, Limits{})
	nc := dialRaw(t, addr, "")
	go io.WriteString(nc, "GET /health HTTP/1.1\r\nHost: worker\r\nX-Big: "+strings.Repeat("b", 2<<20)+"\r\n\r\n")
	// The server hangs up with the rest unread: the client may see its
	// connection reset after the status line, but sees the status.
	resp, _, err := answer(nc, bufio.NewReader(nc), time.Now().Add(10*time.Second))
	if resp == nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("2 MiB of headers: %v %v, want 431", resp, err)
	}
}

// A flood of connections stalled in their requests, as many as the server
// serves and more, locks no well-behaved client out: a new connection
// displaces the one stalled longest, which is told why; the server never
// holds more than MaxConns; the engine sees only the good requests.
func TestStalledFloodDoesNotLockOutOthers(t *testing.T) {
	const maxConns = 16
	e := &testEngine{}
	s, addr := startGuarded(t, e, Limits{MaxConns: maxConns, HeaderTimeout: time.Minute, BodyTimeout: time.Minute})
	var stalled []net.Conn
	for range maxConns {
		stalled = append(stalled, dialRaw(t, addr, stalledPOST))
	}
	waitFor(t, "every stalled connection served", func() bool { return s.ConnStats().Open == maxConns })
	for range maxConns { // more, sending nothing: refused, or displacing stalled bodies
		dialRaw(t, addr, "")
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	const good = 3
	for i := range good {
		deadline := time.Now().Add(10 * time.Second)
		for {
			if open := s.ConnStats().Open; open > maxConns {
				t.Fatalf("the server holds %d connections, over MaxConns %d", open, maxConns)
			}
			status, body, err := complete(client, addr, fmt.Sprintf(`{"prompt":"good %d","max_tokens":2}`, i))
			if err == nil && status == http.StatusOK {
				break
			}
			if err == nil && status != http.StatusServiceUnavailable {
				t.Fatalf("a well-behaved client got %d %s", status, body)
			}
			if time.Now().After(deadline) {
				t.Fatalf("a well-behaved client got no completion before its 10 s deadline: %d %v", status, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var told atomic.Int64
	var wg sync.WaitGroup
	for _, nc := range stalled { // all at once: those not displaced wait out the deadline
		wg.Go(func() {
			resp, body, err := answer(nc, bufio.NewReader(nc), time.Now().Add(2*time.Second))
			if err == nil && resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "make room") {
				told.Add(1)
			}
		})
	}
	wg.Wait()
	st := s.ConnStats()
	if told.Load() == 0 || uint64(told.Load()) > st.Displaced {
		t.Errorf("%d stalled senders were told they were displaced; %d connections displaced in all", told.Load(), st.Displaced)
	}
	if reqs := e.requests(); len(reqs) != good {
		t.Errorf("the engine saw %d requests, want the %d good ones", len(reqs), good)
	}
}

// A connection over MaxConns with none to displace is answered 503 with
// Retry-After, at once.
func TestFullServerRefusesWith503(t *testing.T) {
	s, addr := startGuarded(t, &testEngine{}, Limits{MaxConns: 1, HeaderTimeout: time.Minute})
	dialRaw(t, addr, "GET /health HTTP/1.1\r\nHost: worker\r\n") // headers unfinished: it holds the one place
	waitFor(t, "the first connection served", func() bool { return s.ConnStats().Open == 1 })
	nc := dialRaw(t, addr, "GET /health HTTP/1.1\r\nHost: worker\r\n\r\n")
	resp, body, err := answer(nc, bufio.NewReader(nc), time.Now().Add(10*time.Second))
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("a connection over MaxConns got %v %v, want 503 with Retry-After: 1", resp, err)
	}
	if msg := errorOf(t, body).Message; !strings.Contains(msg, "maximum of 1 connections") {
		t.Errorf("the 503 says %q", msg)
	}
	if st := s.ConnStats(); st.Refused != 1 || st.Open != 1 {
		t.Errorf("stats %+v, want 1 refused and 1 open", st)
	}
}

// A client that stops reading a long stream is cut once a write has made
// no progress for WriteStallTimeout: its engine request is cancelled.
func TestStoppedReaderCancelsItsStream(t *testing.T) {
	e := &testEngine{perOutput: 64, aborted: make(chan string, 1)}
	_, addr := startGuarded(t, e, Limits{WriteStallTimeout: 200 * time.Millisecond})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	body := `{"prompt":"an endless stream","max_tokens":1000000,"ignore_eos":true,"stream":true}`
	fmt.Fprintf(nc, "POST /v1/completions HTTP/1.1\r\nHost: worker\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(nc, 512)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %v %v", resp, err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("the first event: %v", err)
	}
	// The client reads no more, and keeps its connection open.
	select {
	case id := <-e.aborted:
		if !strings.HasPrefix(id, "cmpl-") {
			t.Errorf("aborted %q", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the engine request of a client that stopped reading is still running after 30 s")
	}
}

// A long stream read at a normal pace outlives every timeout: it is cut
// by none of them.
func TestReadStreamOutlivesEveryTimeout(t *testing.T) {
	const tokens = 60
	e := &testEngine{delay: 20 * time.Millisecond} // 60 outputs: over a second
	short := 100 * time.Millisecond
	_, addr := startGuarded(t, e, Limits{HeaderTimeout: short, BodyTimeout: short, MinBodyRate: 1, IdleTimeout: short, WriteStallTimeout: short})
	status, body, err := complete(http.DefaultClient, addr, fmt.Sprintf(`{"prompt":"long","max_tokens":%d,"ignore_eos":true,"stream":true}`, tokens))
	if err != nil || status != http.StatusOK {
		t.Fatalf("stream: %d %v", status, err)
	}
	evs := events(t, body)
	if evs[len(evs)-1] != "[DONE]" || !strings.Contains(evs[len(evs)-2], `"finish_reason":"length"`) || len(evs) != tokens+1 {
		t.Fatalf("the stream ended %q after %d events, want %d tokens then [DONE]", evs[len(evs)-2:], len(evs), tokens)
	}
}

// complete posts a completions request on a fresh or pooled connection.
func complete(c *http.Client, addr, body string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitFor polls cond until it holds, failing after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
