package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A worker process's HTTP port, probed as an attacker would, with the
// flags that bound it: a stalled body is answered 408; a flood of stalled
// connections past --max-connections locks no well-behaved client out.
func TestWorkerHTTPPortSurvivesStalledClients(t *testing.T) {
	const maxConns = 8
	w := startWorkerProcess(t, "", "--speedup", "100", "--max-connections", "8",
		"--http-body-timeout", "500ms", "--http-idle-timeout", "500ms")
	const stalled = "POST /v1/completions HTTP/1.1\r\nHost: worker\r\nContent-Length: 8000000\r\n\r\n{\"prompt\":"
	dial := func(part string) net.Conn {
		nc, err := net.Dial("tcp", w.http)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		io.WriteString(nc, part)
		return nc
	}

	nc := dial(stalled)
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil || resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a stalled body: %v %v, want a 408 before the 10 s deadline", resp, err)
	}

	for range 2 * maxConns {
		dial(stalled)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Post(w.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"good","max_tokens":2}`))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("a well-behaved client got %s", resp.Status)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("a well-behaved client got no completion before its 10 s deadline: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
