package resp_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// A queued command is not applied before EXEC, and EXEC runs the queue as
// one batch whose reads see its earlier writes.
func TestMultiExec(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	c, other := dial(t, addr), dial(t, addr)
	run(t, c, []step{
		{cmd("SET old 1"), "+OK"},
		{cmd("MULTI"), "+OK"},
		{cmd("SET k v"), "+QUEUED"},
		{cmd("GET k"), "+QUEUED"},
		{cmd("DEL old"), "+QUEUED"},
		{cmd("EXISTS k old"), "+QUEUED"},
		{cmd("SET k w XX"), "+QUEUED"},
		{cmd("SET n x NX"), "+QUEUED"},
		{cmd("EXPIRE k 100"), "+QUEUED"},
		{cmd("SET k w KEEPTTL"), "+QUEUED"},
		{cmd("TTL k"), "+QUEUED"},
		{cmd("MGET k n old"), "+QUEUED"},
	})
	run(t, other, []step{{cmd("EXISTS k old"), ":1"}}) // nothing applied yet
	run(t, c, []step{
		{cmd("EXEC"), `[+OK "v" :1 :1 +OK +OK :1 +OK :100 ["w" "x" nil]]`},
	})
	run(t, other, []step{{cmd("MGET k n old"), `["w" "x" nil]`}, {cmd("TTL k"), ":100"}})
}

// A command refused while queueing discards the whole transaction:
// nothing is applied, as Redis does.
func TestMultiExecAbortsOnQueueErrors(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	c := dial(t, addr)
	for _, bad := range []struct{ cmd, want string }{
		{"SET k", "-ERR wrong number of arguments for 'set' command"},
		{"SET k v EX", "-ERR syntax error"},
		{"SET k v EX zero", "-ERR value is not an integer or out of range"},
		{"NOSUCH k", "/^-ERR unknown command 'NOSUCH'/"},
		{"EXPIRE k 10 NX XX", "-ERR NX and XX, GT or LT options at the same time are not compatible"},
		{"SCAN 0", "/^-ERR SCAN is not allowed in a transaction/"},
		{"FLUSHALL", "/^-ERR FLUSHALL is not allowed in a transaction/"},
		{"WATCH k", "/^-ERR WATCH is not supported/"},
		{"MULTI", "-ERR MULTI calls can not be nested"},
	} {
		run(t, c, []step{
			{cmd("MULTI"), "+OK"},
			{cmd("SET a 1"), "+QUEUED"},
			{cmd(bad.cmd), bad.want},
			{cmd("SET b 2"), "+QUEUED"},
			{cmd("EXEC"), "-EXECABORT Transaction discarded because of previous errors."},
			{cmd("EXISTS a b"), ":0"},
		})
	}
	run(t, c, []step{
		{cmd("EXEC"), "-ERR EXEC without MULTI"},
		{cmd("DISCARD"), "-ERR DISCARD without MULTI"},
		{cmd("MULTI"), "+OK"},
		{cmd("SET a 1"), "+QUEUED"},
		{cmd("DISCARD"), "+OK"},
		{cmd("EXEC"), "-ERR EXEC without MULTI"},
		{cmd("EXISTS a"), ":0"},
		{cmd("MULTI"), "+OK"},
		{cmd("EXEC"), "[]"},
		{cmd("UNWATCH"), "+OK"},
		{cmd("MULTI"), "+OK"},
		{cmd("SET a 1"), "+QUEUED"},
		{cmd("RESET"), "+RESET"},
		{cmd("EXEC"), "-ERR EXEC without MULTI"},
		{cmd("EXISTS a"), ":0"},
	})
}

// EXEC's writes apply all or none: a value the store refuses fails EXEC
// and leaves every key as it was.
func TestExecIsAllOrNothing(t *testing.T) {
	store := resptest.NewMemStore()
	store.MaxValue = 1 << 10
	_, addr := startServer(t, store, nil)
	c := dial(t, addr)
	run(t, c, []step{
		{cmd("SET keep old"), "+OK"},
		{cmd("MULTI"), "+OK"},
		{cmd("SET a 1"), "+QUEUED"},
		{cmd("DEL keep"), "+QUEUED"},
		{[]string{"SET", "big", strings.Repeat("x", 2<<10)}, "+QUEUED"},
		{cmd("SET c 3"), "+QUEUED"},
		{cmd("EXEC"), "-ERR resptest: value is 2.0 KiB, over the 1.0 KiB limit"},
		{cmd("EXISTS a big c"), ":0"},
		{cmd("GET keep"), `"old"`},
	})
}

// MSET stores every pair or none.
func TestMSetIsAllOrNothing(t *testing.T) {
	store := resptest.NewMemStore()
	store.MaxValue = 1 << 10
	_, addr := startServer(t, store, nil)
	run(t, dial(t, addr), []step{
		{[]string{"MSET", "a", "1", "big", strings.Repeat("x", 2<<10), "c", "3"}, "-ERR resptest: value is 2.0 KiB, over the 1.0 KiB limit"},
		{cmd("EXISTS a big c"), ":0"},
		{cmd("MSET a 1 a 2 c 3"), "+OK"},
		{cmd("MGET a c"), `["2" "3"]`},
	})
}

// A Store without KeyStore refuses MULTI itself, so that nothing queued
// is ever applied half.
func TestMultiRefusedWithoutKeyStore(t *testing.T) {
	_, addr := startServer(t, plainStore{resptest.NewMemStore()}, nil)
	run(t, dial(t, addr), []step{
		{cmd("MULTI"), "/^-ERR MULTI needs a store that applies batches atomically/"},
		{cmd("SET k v"), "+OK"},
		{cmd("EXEC"), "-ERR EXEC without MULTI"},
		{cmd("MSET a 1 b 2"), "/^-ERR MSET needs a store that applies batches atomically/"},
		{cmd("EXISTS a b"), ":0"},
		{cmd("SCAN 0"), "/^-ERR SCAN needs a store that can list its keys/"},
	})
}

// INFO lists each field once: a Store's field replaces the server's field
// of the same name.
func TestInfoFieldsAppearOnce(t *testing.T) {
	store := infoStore{resptest.NewMemStore(), []resp.InfoField{
		{Section: "memory", Name: "used_memory", Value: "1048576"},
		{Section: "memory", Name: "maxmemory", Value: "4194304"},
	}}
	_, addr := startServer(t, store, nil)
	c := dial(t, addr)
	info := c.do("INFO", "memory")
	seen := map[string]int{}
	for _, l := range strings.Split(strings.Trim(info, `"`), `\r\n`) {
		name, _, _ := strings.Cut(l, ":")
		seen[name]++
	}
	for name, n := range seen {
		if n > 1 && name != "" {
			t.Errorf("INFO memory lists %s %d times:\n%s", name, n, info)
		}
	}
	for _, want := range []string{`\r\nused_memory:1048576\r\n`, `\r\nused_memory_human:1.00M\r\n`, `\r\nmaxmemory:4194304\r\n`, `\r\nmaxmemory_human:4.00M\r\n`} {
		if !strings.Contains(info, want) {
			t.Errorf("INFO memory lacks %s:\n%s", want, info)
		}
	}
	run(t, c, []step{
		{cmd("CONFIG GET maxmemory"), `["maxmemory" "4194304"]`},
		{cmd("CONFIG GET maxmem*"), `["maxmemory" "4194304"]`},
	})
}

// infoStore adds fields to a store's INFO.
type infoStore struct {
	*resptest.MemStore
	extra []resp.InfoField
}

func (s infoStore) Info(ctx context.Context) []resp.InfoField {
	return append(s.MemStore.Info(ctx), s.extra...)
}

// Transactions and MSETs of several clients, on the same keys, never
// interleave their writes: after each, the keys hold one writer's values.
func TestConcurrentTransactionsDoNotInterleave(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dial(t, addr)
			for i := range 200 {
				v := fmt.Sprintf("%d-%d", w, i)
				if w%2 == 0 {
					c.send("MULTI")
					c.send("SET", "a", v)
					c.send("SET", "b", v)
					c.send("SET", "c", v)
					c.send("EXEC")
					c.flush()
					for range 4 {
						c.read()
					}
					if got := c.read(); got != "[+OK +OK +OK]" {
						t.Errorf("EXEC: %s", got)
						return
					}
				} else if got := c.do("MSET", "a", v, "b", v, "c", v); got != "+OK" {
					t.Errorf("MSET: %s", got)
					return
				}
			}
		}()
	}
	wg.Wait()
	c := dial(t, addr)
	if got := c.do("MGET", "a", "b", "c"); !regexp.MustCompile(`^\["([0-9-]+)" "([0-9-]+)" "([0-9-]+)"\]$`).MatchString(got) || strings.Count(got, strings.Fields(strings.Trim(got, "[]"))[0]) != 3 {
		t.Errorf("keys after the writers: %s, want one writer's values", got)
	}
}

// recordingStore records the writes that reach a MemStore.
type recordingStore struct {
	*resptest.MemStore
	mu     sync.Mutex
	writes []string
}

func (s *recordingStore) record(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, what)
}

func (s *recordingStore) recorded() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.writes...)
}

func (s *recordingStore) Set(ctx context.Context, key string, value []byte) error {
	s.record("Set " + key)
	return s.MemStore.Set(ctx, key, value)
}

func (s *recordingStore) SetWith(ctx context.Context, key string, value []byte, opts resp.SetOptions) (bool, error) {
	s.record("SetWith " + key)
	return s.MemStore.SetWith(ctx, key, value, opts)
}

func (s *recordingStore) Delete(ctx context.Context, key string) (bool, error) {
	s.record("Delete " + key)
	return s.MemStore.Delete(ctx, key)
}

func (s *recordingStore) Expire(ctx context.Context, key string, at time.Time) (time.Time, error) {
	s.record("Expire " + key)
	return s.MemStore.Expire(ctx, key, at)
}

func (s *recordingStore) Apply(ctx context.Context, ws []resp.Write) error {
	var b strings.Builder
	for _, w := range ws {
		if w.Delete {
			b.WriteString(" -" + w.Key)
		} else {
			fmt.Fprintf(&b, " %s=%s", w.Key, w.Value)
		}
	}
	s.record("Apply" + b.String())
	return s.MemStore.Apply(ctx, ws)
}

// EXEC reaches the store as one Apply of every write, in order, after
// every command of the transaction ran: nothing is written before.
func TestExecIsOneApply(t *testing.T) {
	store := &recordingStore{MemStore: resptest.NewMemStore()}
	_, addr := startServer(t, store, nil)
	c := dial(t, addr)
	run(t, c, []step{
		{cmd("MSET x 0 y 0"), "+OK"},
		{cmd("MULTI"), "+OK"},
		{cmd("SET a 1"), "+QUEUED"},
		{cmd("DEL x nope"), "+QUEUED"},
		{cmd("MSET b 2 a 3"), "+QUEUED"},
		{cmd("EXPIRE y 100"), "+QUEUED"},
		{cmd("SETEX s 10 v"), "+QUEUED"},
		{cmd("GET a"), "+QUEUED"},
	})
	if w := store.recorded(); len(w) != 1 {
		t.Fatalf("writes before EXEC: %q", w)
	}
	run(t, c, []step{{cmd("EXEC"), `[+OK :1 +OK :1 +OK "3"]`}})
	if want := []string{"Apply x=0 y=0", "Apply a=1 -x b=2 a=3 y=0 s=v"}; strings.Join(store.recorded(), "|") != strings.Join(want, "|") {
		t.Errorf("writes: %q, want %q", store.recorded(), want)
	}
	run(t, c, []step{{cmd("TTL y"), ":100"}, {cmd("TTL s"), ":10"}, {cmd("MGET a b x"), `["3" "2" nil]`}})
}

// A command the reader refuses, an argument over the bulk limit, discards
// the transaction as any refused command does.
func TestMultiAbortsOnArgumentOverTheLimit(t *testing.T) {
	_, addr := startServer(t, nil, &resp.Config{MaxBulkLen: 1 << 10})
	run(t, dial(t, addr), []step{
		{cmd("MULTI"), "+OK"},
		{cmd("SET a 1"), "+QUEUED"},
		{[]string{"SET", "big", strings.Repeat("x", 2<<10)}, "/^-ERR argument of 2048 bytes is over the 1.0 KiB limit/"},
		{cmd("EXEC"), execAbort},
		{cmd("EXISTS a big"), ":0"},
	})
}
