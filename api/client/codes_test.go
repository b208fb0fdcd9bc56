package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/dataplane"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// nodeWithDataAt serves a node whose Info names data as its data-plane
// address, where the test serves (or does not serve) the data plane.
func nodeWithDataAt(t *testing.T, data string, limits node.Config) *nodetest.Node {
	t.Helper()
	return nodetest.Start(t, nodetest.Options{Limits: limits, DataAddr: data})
}

func listenData(t *testing.T, n *nodetest.Node, addr string, maxBlockSize, maxConns int) transfer.Listener {
	t.Helper()
	l, err := tcp.New(tcp.Options{MaxBlockSize: maxBlockSize, MaxBlocks: n.Config().MaxBatchBlocks, MaxConns: maxConns}).
		Listen(addr, dataplane.NewHandler(n.Node, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// A data plane that refuses the connection once came back as Unknown, not
// retried and not ErrUnavailable.
func TestRefusedDataPlaneIsUnavailableAfterTheRetryBudget(t *testing.T) {
	n := nodeWithDataAt(t, freeport.Addr(t), node.Config{})
	c := dial(t, n.Addr, client.Options{RetryBudget: 300 * time.Millisecond, Backoff: 20 * time.Millisecond})
	_, blocks := chain(2, 1000)
	start := time.Now()
	err := c.Put(context.Background(), blocks)
	var ce *client.Error
	if !errors.Is(err, client.ErrUnavailable) || !errors.As(err, &ce) || ce.Code != codes.Unavailable {
		t.Fatalf("put with the data plane down: %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Fatalf("put gave up after %v, before half its 300ms retry budget", took)
	}
	if _, err := c.Get(context.Background(), nil); err != nil {
		t.Fatalf("get of nothing: %v", err)
	}
	_, err = c.Get(context.Background(), []index.Key{blocks[0].Key})
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("get with the data plane down: %v, want ErrUnavailable", err)
	}
}

// A data plane that comes up while a call is retrying serves it: the
// caller does not retry.
func TestACallRidesOutADataPlaneThatComesBack(t *testing.T) {
	addr := freeport.Addr(t)
	n := nodeWithDataAt(t, addr, node.Config{})
	c := dial(t, n.Addr, client.Options{})
	up := make(chan transfer.Listener, 1)
	time.AfterFunc(500*time.Millisecond, func() {
		l, err := tcp.New(tcp.Options{MaxBlockSize: int(n.Config().MaxBlockSize), MaxBlocks: n.Config().MaxBatchBlocks}).
			Listen(addr, dataplane.NewHandler(n.Node, nil))
		if err != nil {
			t.Error(err)
		}
		up <- l
	})
	t.Cleanup(func() {
		if l := <-up; l != nil {
			l.Close()
		}
	})
	_, blocks := chain(3, 4096)
	if err := c.Put(context.Background(), blocks); err != nil {
		t.Fatalf("put while the data plane comes up: %v", err)
	}
	res, err := c.Get(context.Background(), []index.Key{blocks[2].Key})
	if err != nil || !res[0].Found {
		t.Fatalf("get: %v %v", res, err)
	}
}

// A node at its connection limit once answered InvalidArgument ("request
// refused"), which no client retries; it is Unavailable, retried, and says
// which limit.
func TestConnectionLimitIsUnavailableNotInvalid(t *testing.T) {
	addr := freeport.Addr(t)
	n := nodeWithDataAt(t, addr, node.Config{})
	listenData(t, n, addr, int(n.Config().MaxBlockSize), 1)
	holder := dial(t, n.Addr, client.Options{})
	_, blocks := chain(1, 1000)
	if err := holder.Put(context.Background(), blocks); err != nil { // its connection stays pooled
		t.Fatal(err)
	}
	c := dial(t, n.Addr, client.Options{RetryBudget: 200 * time.Millisecond, Backoff: 20 * time.Millisecond})
	_, err := c.Get(context.Background(), []index.Key{blocks[0].Key})
	if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "limit of 1 data-plane connections") {
		t.Fatalf("get over the connection limit: %v, want ErrUnavailable naming the limit", err)
	}
	holder.Close() // the slot frees: the next call gets in
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := c.Get(context.Background(), []index.Key{blocks[0].Key})
		if err == nil && res[0].Found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("get once the slot is free: %v %v", res, err)
		}
	}
}

// A block the node refuses over the data plane (over its limit, where the
// transport's is higher) came back as Unknown; it is ErrInvalid and says
// why.
func TestABlockTheNodeRefusesIsInvalidOverTheDataPlane(t *testing.T) {
	addr := freeport.Addr(t)
	n := nodeWithDataAt(t, addr, node.Config{MaxBlockSize: 64 << 10})
	listenData(t, n, addr, 1<<20, 8)
	c := dial(t, n.Addr, client.Options{})
	c.Info().MaxBlockSize = 1 << 20 // a client that does not check
	_, blocks := chain(2, 1000, 100<<10)
	err := c.Put(context.Background(), blocks)
	var be *client.BatchError
	if !errors.As(err, &be) || be.Errs[0] != nil || !errors.Is(be.Errs[1], client.ErrInvalid) ||
		!strings.Contains(be.Errs[1].Error(), "over the 64.0 KiB limit") {
		t.Fatalf("put of a block over the node's limit: %v, want block 1 ErrInvalid saying why", err)
	}
}
