package resp_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// go-redis, as an application uses it: its default options, transactions
// (TxPipelined: MULTI … EXEC), pipelines, and the key commands.
func TestGoRedis(t *testing.T) {
	store := resptest.NewMemStore()
	store.MaxValue = 1 << 20
	_, addr := startServer(t, store, nil)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	// A transaction: its replies, in order, and its writes all applied.
	var get *redis.StringCmd
	var ttl *redis.DurationCmd
	cmds, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "a", "1", 0)
		p.Set(ctx, "b", "2", time.Minute)
		get = p.Get(ctx, "a")
		p.Expire(ctx, "a", time.Hour)
		ttl = p.TTL(ctx, "a")
		p.Del(ctx, "gone")
		return nil
	})
	must(err)
	if len(cmds) != 6 || get.Val() != "1" || ttl.Val() != time.Hour {
		t.Errorf("TxPipelined: %v; GET a = %q, TTL a = %v", cmds, get.Val(), ttl.Val())
	}
	if d := rdb.TTL(ctx, "b").Val(); d != time.Minute {
		t.Errorf("TTL b = %v, want 1m", d)
	}

	// A transaction the store refuses leaves every key as it was.
	_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "a", "changed", 0)
		p.Set(ctx, "huge", strings.Repeat("x", 2<<20), 0)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "over the 1.0 MiB limit") {
		t.Errorf("TxPipelined with a value over the limit: %v", err)
	}
	if v := rdb.Get(ctx, "a").Val(); v != "1" {
		t.Errorf("a = %q after the refused transaction, want 1", v)
	}
	// WATCH is refused, so Watch fails before running the function.
	err = rdb.Watch(ctx, func(tx *redis.Tx) error { return nil }, "a")
	if err == nil || !strings.Contains(err.Error(), "WATCH is not supported") {
		t.Errorf("Watch: %v", err)
	}

	// A plain pipeline and the key commands.
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range []string{"k1", "k2", "k3", "other"} {
			p.Set(ctx, k, "v", 0)
		}
		return nil
	})
	must(err)
	must(rdb.MSet(ctx, "m1", "x", "m2", "yy").Err())
	var scanned []string
	iter := rdb.Scan(ctx, 0, "k*", 2).Iterator()
	for iter.Next(ctx) {
		scanned = append(scanned, iter.Val())
	}
	must(iter.Err())
	sort.Strings(scanned)
	if strings.Join(scanned, " ") != "k1 k2 k3" {
		t.Errorf("SCAN k* = %v", scanned)
	}
	keys, err := rdb.Keys(ctx, "m?").Result()
	must(err)
	sort.Strings(keys)
	if strings.Join(keys, " ") != "m1 m2" {
		t.Errorf("KEYS m? = %v", keys)
	}
	if typ := rdb.Type(ctx, "m1").Val(); typ != "string" {
		t.Errorf("TYPE m1 = %q", typ)
	}
	if n := rdb.StrLen(ctx, "m2").Val(); n != 2 {
		t.Errorf("STRLEN m2 = %d", n)
	}
	if n := rdb.MemoryUsage(ctx, "m2").Val(); n != 2+2+resptest.EntryOverhead {
		t.Errorf("MEMORY USAGE m2 = %d", n)
	}
	if ok := rdb.ExpireGT(ctx, "m1", time.Minute).Val(); ok {
		t.Error("EXPIRE m1 60 GT on a key without a deadline set one")
	}
	if ok := rdb.ExpireNX(ctx, "m1", time.Minute).Val(); !ok {
		t.Error("EXPIRE m1 60 NX failed")
	}
	if d := rdb.PTTL(ctx, "m1").Val(); d <= 59*time.Second || d > time.Minute {
		t.Errorf("PTTL m1 = %v", d)
	}
	if ok := rdb.Persist(ctx, "m1").Val(); !ok {
		t.Error("PERSIST m1 failed")
	}
	if err := rdb.SetArgs(ctx, "s", "v", redis.SetArgs{Mode: "NX", TTL: time.Minute}).Err(); err != nil {
		t.Errorf("SET s v NX EX 60: %v", err)
	}
	if err := rdb.SetNX(ctx, "s", "w", 0).Err(); err != nil && !errors.Is(err, redis.Nil) {
		t.Errorf("SETNX: %v", err)
	}
	if tm, err := rdb.Time(ctx).Result(); err != nil || time.Since(tm).Abs() > time.Minute {
		t.Errorf("TIME = %v, %v", tm, err)
	}
	if v, err := rdb.ConfigGet(ctx, "maxmemory").Result(); err != nil || v["maxmemory"] != "0" {
		t.Errorf("CONFIG GET maxmemory = %v, %v", v, err)
	}
	if n, err := rdb.IncrBy(ctx, "counter", 5).Result(); n != 5 || err != nil {
		t.Errorf("INCRBY of a missing key = %d, %v; want 5", n, err)
	}
	if n, err := rdb.Decr(ctx, "counter").Result(); n != 4 || err != nil {
		t.Errorf("DECR = %d, %v; want 4", n, err)
	}
	if err := rdb.LPush(ctx, "list", "x").Err(); err == nil || !strings.Contains(err.Error(), "lists are not supported") {
		t.Errorf("LPUSH: %v", err)
	}
	must(rdb.FlushDB(ctx).Err())
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Errorf("DBSIZE after FLUSHDB = %d", n)
	}
}
