package resp_test

import (
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/api/resp"
)

// A value over MaxBulkLen is answered with an error naming the limit, on a
// connection that stays in step: the commands pipelined after it run, and
// nothing of the refused command is applied.
func TestOversizedValueIsRefusedAndTheConnectionStaysUsable(t *testing.T) {
	srv, addr := startServer(t, nil, &resp.Config{MaxBulkLen: 1 << 20, MaxBulkLenSetting: "limits.max-value-size"})
	c := dial(t, addr)
	run(t, c, []step{{cmd("SET k old"), "+OK"}})
	c.send("SET", "k", strings.Repeat("x", 1<<20+1))
	c.send("GET", "k")
	c.send("MSET", "a", "1", "b", strings.Repeat("y", 2<<20))
	c.send("EXISTS", "a")
	c.flush()
	for _, want := range []string{
		"-ERR argument of 1048577 bytes is over the 1.0 MiB limit on one value (limits.max-value-size)",
		`"old"`,
		"-ERR argument of 2097152 bytes is over the 1.0 MiB limit on one value (limits.max-value-size)",
		":0",
	} {
		if got := c.read(); got != want {
			t.Fatalf("got %s, want %s", got, want)
		}
	}
	run(t, c, []step{{cmd("SET k new"), "+OK"}, {cmd("GET k"), `"new"`}})
	if st := srv.Stats(); st.ProtocolErrors != 0 || st.PendingBytes != 0 {
		t.Fatalf("after refusals: %d protocol errors, %d bytes pending; want 0 and 0", st.ProtocolErrors, st.PendingBytes)
	}
}
