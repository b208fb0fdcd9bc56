// Package hung gives tests a peer that hangs: a loopback listener whose
// kernel still accepts connections while nothing ever reads or answers
// them, as a process that is stuck but not dead. Safe for concurrent use.
package hung

import (
	"net"
	"sync"
	"testing"
)

// Listener listens on a loopback port, accepts every connection and never
// answers; it returns the address. Everything is closed when t ends.
func Listener(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}
