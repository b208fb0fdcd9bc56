package hung

import (
	"net"
	"testing"
	"time"
)

func TestListenerAcceptsAndNeverAnswers(t *testing.T) {
	c, err := net.Dial("tcp", Listener(t))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var b [1]byte
	if n, err := c.Read(b[:]); n != 0 || err == nil {
		t.Fatalf("read %d bytes, %v; want nothing before the deadline", n, err)
	}
}
