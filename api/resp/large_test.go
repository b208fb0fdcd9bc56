package resp_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
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

// pieceStore streams every value of a MemStore in three pieces; a value
// "broken" fails after its first piece.
type pieceStore struct{ *resptest.MemStore }

func (s pieceStore) ViewStream(ctx context.Context, key string) (resp.StreamValue, error) {
	v, release, err := s.View(ctx, key)
	if err != nil {
		return resp.StreamValue{}, err
	}
	b := bytes.Clone(v)
	release()
	return resp.StreamValue{Size: int64(len(b)), Stream: func(emit func([]byte) error) error {
		third := len(b) / 3
		for i, p := range [][]byte{b[:third], b[third : 2*third], b[2*third:]} {
			if i == 1 && string(b) == "broken:"+strings.Repeat("b", 100<<10) {
				return errors.New("piece lost")
			}
			if err := emit(p); err != nil {
				return err
			}
		}
		return nil
	}}, nil
}

// GET writes a Streamer's value piece by piece, pipelined replies in
// order around it; a stream that fails midway closes the connection, so
// the client never takes part of a value for all of it.
func TestGETStreamsValuesInPieces(t *testing.T) {
	_, addr := startServer(t, pieceStore{resptest.NewMemStore()}, nil)
	c := dial(t, addr)
	big := strings.Repeat("0123456789", 300<<10) // 3 MiB
	run(t, c, []step{{cmd("SET small v"), "+OK"}})
	c.send("SET", "big", big)
	c.send("GET", "small")
	c.send("GET", "big")
	c.send("GET", "nothing")
	c.send("PING")
	c.flush()
	for _, want := range []string{"+OK", `"v"`, strconv.Quote(big), "nil", "+PONG"} {
		if got := c.read(); got != want {
			t.Fatalf("got %.40s…, want %.40s…", got, want)
		}
	}
	broken := "broken:" + strings.Repeat("b", 100<<10)
	b := dial(t, addr)
	run(t, b, []step{{[]string{"SET", "broken", broken}, "+OK"}})
	b.send("GET", "broken")
	b.flush()
	if r, err := readReply(b.br); err == nil {
		t.Fatalf("a failed stream was read as a whole reply (%d bytes)", len(r))
	}
	if !b.closed() {
		t.Fatal("connection still open after a failed stream")
	}
}
