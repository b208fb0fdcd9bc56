package respnode_test

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/api/resp"
)

// Update reads a chunked value whole, keeps what fn keeps (the deadline)
// and is atomic: concurrent increments all count.
func TestRESPUpdate(t *testing.T) {
	_, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, Inline: true})
	ctx := context.Background()
	big := bytes.Repeat([]byte("0123456789"), 3*block/10)
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if _, err := s.SetWith(ctx, "big", big, resp.SetOptions{ExpireAt: at}); err != nil {
		t.Fatal(err)
	}
	err := s.Update(ctx, "big", func(old []byte, info resp.KeyInfo, found bool) (resp.Write, error) {
		if !found || !bytes.Equal(old, big) || !info.ExpireAt.Equal(at) {
			t.Errorf("Update saw %d bytes, %v, found %v; want the %d-byte value and %v", len(old), info.ExpireAt, found, len(big), at)
		}
		return resp.Write{Value: append(append([]byte(nil), old...), "xyz"...), ExpireAt: info.ExpireAt}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	v, release, err := s.View(ctx, "big")
	if err != nil || !bytes.Equal(v, append(big, "xyz"...)) {
		t.Fatalf("after APPEND: %d bytes, %v", len(v), err)
	}
	release()
	if ki, err := s.Stat(ctx, "big"); err != nil || !ki.ExpireAt.Equal(at) {
		t.Fatalf("deadline after the update = %v, %v; want %v", ki.ExpireAt, err, at)
	}

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				err := s.Update(ctx, "n", func(old []byte, _ resp.KeyInfo, _ bool) (resp.Write, error) {
					n, _ := strconv.Atoi(string(old))
					return resp.Write{Value: []byte(strconv.Itoa(n + 1))}, nil
				})
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	v, release, err = s.View(ctx, "n")
	if err != nil || string(v) != "200" {
		t.Fatalf("after 8 x 25 increments: %q, %v", v, err)
	}
	release()
	if err := s.Update(ctx, "n", func([]byte, resp.KeyInfo, bool) (resp.Write, error) { return resp.Write{Delete: true}, nil }); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Exists(ctx, "n"); ok {
		t.Fatal("the key is there after an Update that deletes it")
	}
}
