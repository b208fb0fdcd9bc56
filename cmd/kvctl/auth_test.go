package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
)

// kvctl presents a token from --token, --token-file or KVSTRATA_TOKEN;
// evict --all needs the operate role: a reader-writer is refused, an
// operator empties the node; without a token it says what to give.
func TestEvictAllNeedsAnOperatorsToken(t *testing.T) {
	srv := nodetest.Start(t, nodetest.Options{Auth: nodetest.Users(t)})
	c, err := client.Dial(context.Background(), srv.Addr, client.Options{Token: nodetest.TokenAlice})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := index.Key{NS: 0xaa, Hash: 1}
	if err := c.Put(context.Background(), []client.Block{{Key: key, Data: bytes.Repeat([]byte{1}, 4096)}}); err != nil {
		t.Fatal(err)
	}

	code, _, stderr := run(t, "--addr", srv.Addr, "evict", "--all", "--yes")
	wantFailure(t, code, stderr, exitFailure, "authenticates its clients: give a valid token with --token, --token-file or KVSTRATA_TOKEN")

	code, _, stderr = run(t, "--addr", srv.Addr, "--token", nodetest.TokenAlice, "evict", "--all", "--yes")
	wantFailure(t, code, stderr, exitFailure, "permission denied")
	if !strings.Contains(stderr, "operate") {
		t.Errorf("the refusal does not name the role it needs: %s", stderr)
	}
	code, _, stderr = runWith(t, session{env: map[string]string{"KVSTRATA_TOKEN": nodetest.TokenAlice}},
		"--addr", srv.Addr, "evict", "--all", "--yes")
	wantFailure(t, code, stderr, exitFailure, "permission denied")
	kept := index.Key{NS: index.BindTenant("acme", key.NS), Hash: key.Hash} // alice's tenant
	if h := held(t, srv.Node, kept); !h[0] {
		t.Fatal("a refused eviction removed the block")
	}

	file := filepath.Join(t.TempDir(), "ops.token")
	if err := os.WriteFile(file, []byte(nodetest.TokenOperator+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run(t, "--addr", srv.Addr, "--token-file", file, "evict", "--all", "--yes")
	if code != exitOK || !strings.HasPrefix(out, "Evicted 1 block") {
		t.Fatalf("an operator's evict --all: status %d\n%s%s", code, out, stderr)
	}

	code, _, stderr = run(t, "--addr", srv.Addr, "--token", "x", "--token-file", file, "stats")
	wantFailure(t, code, stderr, exitUsage, "--token and --token-file both given")
}
