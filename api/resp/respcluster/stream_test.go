package respcluster_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// halves streams each value of a MemStore in two pieces.
type halves struct{ *resptest.MemStore }

func (s halves) ViewStream(ctx context.Context, key string) (resp.StreamValue, error) {
	v, release, err := s.View(ctx, key)
	if err != nil {
		return resp.StreamValue{}, err
	}
	b := bytes.Clone(v)
	release()
	return resp.StreamValue{Size: int64(len(b)), Stream: func(emit func([]byte) error) error {
		if err := emit(b[:len(b)/2]); err != nil {
			return err
		}
		return emit(b[len(b)/2:])
	}}, nil
}

// A value held here streams as the local store streams it; one held by
// another node comes whole; a key nowhere is a miss.
func TestViewStreamStreamsLocalValues(t *testing.T) {
	c := newClusterOf(t, 2, 20*time.Second, func() resp.Store { return halves{resptest.NewMemStore()} })
	k := c.key("big")
	v := bytes.Repeat([]byte("0123456789"), 1000)
	if err := c.stores[1].Set(ctx(t), k, v); err != nil {
		t.Fatal(err)
	}
	local, err := c.stores[1].(resp.Streamer).ViewStream(ctx(t), k)
	if err != nil || local.Stream == nil {
		t.Fatalf("local value: %+v, %v; want a stream", local, err)
	}
	var got []byte
	if err := local.Stream(func(p []byte) error { got = append(got, p...); return nil }); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("local stream: %d bytes, %v", len(got), err)
	}
	remote, err := c.stores[2].(resp.Streamer).ViewStream(ctx(t), k)
	if err != nil || remote.Stream != nil || !bytes.Equal(remote.Bytes, v) {
		t.Fatalf("remote value: %d bytes, stream %v, %v; want the value whole", len(remote.Bytes), remote.Stream != nil, err)
	}
	if _, err := c.stores[2].(resp.Streamer).ViewStream(ctx(t), c.key("none")); !errors.Is(err, resp.ErrNotFound) {
		t.Fatalf("a key nowhere: %v, want a miss", err)
	}
}
