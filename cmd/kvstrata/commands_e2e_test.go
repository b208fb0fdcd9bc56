package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Redis commands clients send, against a real node (its store is
// respnode's KeyStore): transactions, all-or-nothing MSET, expiry, SCAN,
// KEYS, MEMORY USAGE, INFO memory, CONFIG GET maxmemory and FLUSHALL,
// through go-redis and redis-cli as their users run them.
func TestRedisCommandsOnANode(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli not installed (Debian package redis-tools)")
	}
	p := startNode(t, t.TempDir(), "--limits-max-value-size", "1MiB")
	host, port, _ := net.SplitHostPort(p.resp)
	rc := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(cli, append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	rdb := redis.NewClient(&redis.Options{Addr: p.resp})
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// MULTI … EXEC: one batch, its reads see its writes.
	var get *redis.StringCmd
	_, err = rdb.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		pl.Set(ctx, "a", "1", 0)
		pl.Set(ctx, "b", "2", time.Minute)
		get = pl.Get(ctx, "a")
		return nil
	})
	if err != nil || get.Val() != "1" {
		t.Fatalf("TxPipelined: %v, GET a in it = %q", err, get.Val())
	}
	// A transaction, and an MSET, with a value over the limit change nothing.
	big := strings.Repeat("x", 2<<20)
	_, err = rdb.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		pl.Set(ctx, "a", "changed", 0)
		pl.Set(ctx, "big", big, 0)
		return nil
	})
	if err == nil {
		t.Error("a transaction with a value over limits.max-value-size succeeded")
	}
	if err := rdb.MSet(ctx, "c", "3", "big", big, "d", "4").Err(); err == nil {
		t.Error("an MSET with a value over limits.max-value-size succeeded")
	}
	if v := rdb.MGet(ctx, "a", "big", "c", "d").Val(); fmt.Sprint(v) != "[1 <nil> <nil> <nil>]" {
		t.Errorf("MGET a big c d after the refused writes = %v, want [1 <nil> <nil> <nil>]", v)
	}

	// Expiry: a deadline is a promise the key is gone by then.
	if d := rdb.TTL(ctx, "b").Val(); d <= 0 || d > time.Minute {
		t.Errorf("TTL b = %v, want at most the minute it was given", d)
	}
	if rdb.Persist(ctx, "b").Val() != true || rdb.TTL(ctx, "b").Val() != -1 {
		t.Error("PERSIST b did not remove its deadline")
	}
	rdb.Set(ctx, "brief", "v", 300*time.Millisecond)
	time.Sleep(400 * time.Millisecond) // past the deadline
	if err := rdb.Get(ctx, "brief").Err(); err != redis.Nil {
		t.Errorf("GET brief after its deadline: %v, want a miss", err)
	}
	if rdb.Exists(ctx, "brief").Val() != 0 || rdb.TTL(ctx, "brief").Val() != -2 {
		t.Error("brief exists after its deadline")
	}

	// The keyspace tools.
	for i := range 40 {
		rdb.Set(ctx, fmt.Sprintf("prompt:%02d", i), strings.Repeat("p", i+1), 0)
	}
	if n := len(strings.Fields(rc("--scan"))); n != 42 {
		t.Errorf("redis-cli --scan listed %d keys, want 42", n)
	}
	keys := strings.Fields(rc("KEYS", "prompt:1*"))
	sort.Strings(keys)
	if len(keys) != 10 || keys[0] != "prompt:10" {
		t.Errorf("KEYS prompt:1* = %v", keys)
	}
	if got := rc("--bigkeys"); !strings.Contains(got, "Biggest string found '\"prompt:39\"' has 40 bytes") {
		t.Errorf("redis-cli --bigkeys:\n%s", got)
	}
	if n := rdb.MemoryUsage(ctx, "prompt:39").Val(); n < 40 {
		t.Errorf("MEMORY USAGE prompt:39 = %d, want at least its 40 bytes", n)
	}
	if rc("TYPE", "prompt:01") != "string" || rc("STRLEN", "prompt:01") != "2" {
		t.Error("TYPE or STRLEN of prompt:01 is wrong")
	}
	script := fmt.Sprintf("%[1]s -h %[2]s -p %[3]s --scan --pattern 'prompt:*' | xargs %[1]s -h %[2]s -p %[3]s DEL", cli, host, port)
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "40" {
		t.Fatalf("%s: %v, %q; want 40 keys deleted", script, err, out)
	}
	if rc("DBSIZE") != "2" {
		t.Errorf("DBSIZE after deleting prompt:* = %s, want 2", rc("DBSIZE"))
	}

	// INFO memory lists each field once; CONFIG GET maxmemory is the DRAM tier's.
	seen := map[string]bool{}
	for _, l := range strings.Split(rc("INFO", "memory"), "\n") {
		name, _, ok := strings.Cut(strings.TrimSpace(l), ":")
		if ok && seen[name] {
			t.Errorf("INFO memory lists %s twice", name)
		}
		seen[name] = true
	}
	if got := rc("CONFIG", "GET", "maxmemory"); got != "maxmemory\n67108864" {
		t.Errorf("CONFIG GET maxmemory = %q, want the 64 MiB of DRAM", got)
	}
	if rc("FLUSHALL") != "OK" || rc("DBSIZE") != "0" {
		t.Error("FLUSHALL left keys")
	}
}
