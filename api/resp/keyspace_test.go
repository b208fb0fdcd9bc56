package resp_test

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// clock is a settable time for MemStore's deadlines.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// storeWithClock is a MemStore whose deadlines are read by a clock the
// test moves.
func storeWithClock() (*resptest.MemStore, *clock) {
	store := resptest.NewMemStore()
	clk := &clock{t: time.Now()}
	store.SetClock(clk.now)
	return store, clk
}

func TestExpiry(t *testing.T) {
	store, clk := storeWithClock()
	_, addr := startServer(t, store, nil)
	c := dial(t, addr)
	future := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	futureMs := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	past := strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)
	run(t, c, []step{
		{cmd("TTL nope"), ":-2"},
		{cmd("PTTL nope"), ":-2"},
		{cmd("SET k v"), "+OK"},
		{cmd("TTL k"), ":-1"},
		{cmd("EXPIRE nope 10"), ":0"},
		{cmd("EXPIRE k 100"), ":1"},
		{cmd("TTL k"), ":100"},
		{cmd("PTTL k"), "/^:(99[0-9]{3}|100000)$/"},
		{cmd("EXPIRE k 50 NX"), ":0"},
		{cmd("EXPIRE k 50 GT"), ":0"},
		{cmd("EXPIRE k 200 GT"), ":1"},
		{cmd("TTL k"), ":200"},
		{cmd("EXPIRE k 300 LT"), ":0"},
		{cmd("EXPIRE k 150 XX LT"), ":1"},
		{cmd("TTL k"), ":150"},
		{cmd("PEXPIRE k 120000"), ":1"},
		{cmd("TTL k"), ":120"},
		{cmd("EXPIREAT k " + future), ":1"},
		{cmd("TTL k"), "/^:(3599|3600)$/"},
		{cmd("PEXPIREAT k " + futureMs), ":1"},
		{cmd("PERSIST k"), ":1"},
		{cmd("PERSIST k"), ":0"},
		{cmd("PERSIST nope"), ":0"},
		{cmd("TTL k"), ":-1"},
		{cmd("EXPIRE k 10 XX"), ":0"},
		{cmd("EXPIRE k 10 GT"), ":0"}, // no deadline counts as infinite
		{cmd("EXPIRE k 10 LT"), ":1"},
		{cmd("EXPIRE k 10 NX XX"), "-ERR NX and XX, GT or LT options at the same time are not compatible"},
		{cmd("EXPIRE k 10 GT LT"), "-ERR GT and LT options at the same time are not compatible"},
		{cmd("EXPIRE k 10 SOON"), "-ERR Unsupported option SOON"},
		{cmd("EXPIRE k ten"), "-ERR value is not an integer or out of range"},
		{cmd("EXPIRE k 9223372036854775807"), "-ERR invalid expire time in 'expire' command"},
		{cmd("EXPIRE k"), "-ERR wrong number of arguments for 'expire' command"},
		{cmd("TTL k"), ":10"}, // the refused commands changed nothing

		// SET's options.
		{cmd("SET e v EX 10"), "+OK"},
		{cmd("TTL e"), ":10"},
		{cmd("SET e v PX 20000"), "+OK"},
		{cmd("TTL e"), ":20"},
		{cmd("SET e v EXAT " + future), "+OK"},
		{cmd("TTL e"), "/^:(3599|3600)$/"},
		{cmd("SET e w KEEPTTL"), "+OK"},
		{cmd("TTL e"), "/^:(3599|3600)$/"},
		{cmd("GET e"), `"w"`},
		{cmd("SET e v PXAT " + futureMs + " XX"), "+OK"},
		{cmd("SET e v"), "+OK"}, // a plain SET drops the deadline, as Redis
		{cmd("TTL e"), ":-1"},
		{cmd("SET e v EX 0"), "-ERR invalid expire time in 'set' command"},
		{cmd("SET e v EX -5"), "-ERR invalid expire time in 'set' command"},
		{cmd("SET e v EX 10 PX 10"), "-ERR syntax error"},
		{cmd("SET e v EX 10 KEEPTTL"), "-ERR syntax error"},
		{cmd("SET e v EX"), "-ERR syntax error"},
		{cmd("SET e v EX x"), "-ERR value is not an integer or out of range"},
		{cmd("SETEX s 30 v"), "+OK"},
		{cmd("TTL s"), ":30"},
		{cmd("PSETEX s 40000 v"), "+OK"},
		{cmd("TTL s"), ":40"},
		{cmd("SETEX s 0 v"), "-ERR invalid expire time in 'setex' command"},
		{cmd("SETNX s w"), ":0"},
		{cmd("SETNX n w"), ":1"},

		// A deadline in the past deletes the key.
		{cmd("SET gone v"), "+OK"},
		{cmd("EXPIREAT gone " + past), ":1"},
		{cmd("EXISTS gone"), ":0"},
		{cmd("SET gone v EXAT " + past), "+OK"},
		{cmd("EXISTS gone"), ":0"},
		{cmd("DBSIZE"), ":4"},
	})
	// Past its deadline a key is gone for every command.
	clk.advance(11 * time.Second)
	run(t, c, []step{
		{cmd("GET k"), "nil"},
		{cmd("EXISTS k"), ":0"},
		{cmd("TTL k"), ":-2"},
		{cmd("TYPE k"), "+none"},
		{cmd("STRLEN k"), ":0"},
		{cmd("MEMORY USAGE k"), "nil"},
		{cmd("PERSIST k"), ":0"},
		{cmd("EXPIRE k 10"), ":0"},
		{cmd("KEYS *"), `["e" "s" "n"]`},
		{cmd("DBSIZE"), ":3"},
	})
}

func TestTypeStrlenMemoryTimeFlush(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	c := dial(t, addr)
	run(t, c, []step{
		{cmd("SET key hello"), "+OK"},
		{cmd("TYPE key"), "+string"},
		{cmd("TYPE nope"), "+none"},
		{cmd("STRLEN key"), ":5"},
		{cmd("STRLEN nope"), ":0"},
		{cmd("MEMORY USAGE key"), fmt.Sprintf(":%d", 3+5+resptest.EntryOverhead)},
		{cmd("MEMORY USAGE key SAMPLES 0"), fmt.Sprintf(":%d", 3+5+resptest.EntryOverhead)},
		{cmd("MEMORY USAGE key SAMPLES"), "-ERR syntax error"},
		{cmd("MEMORY USAGE nope"), "nil"},
		{cmd("MEMORY NOPE"), "-ERR unknown subcommand 'NOPE'. Try MEMORY HELP."},
		{cmd("TIME"), `/^\["[0-9]{10}" "[0-9]{1,6}"\]$/`},
		{cmd("SET other x"), "+OK"},
		{cmd("FLUSHDB NOW"), "-ERR syntax error"},
		{cmd("DBSIZE"), ":2"},
		{cmd("FLUSHDB ASYNC"), "+OK"},
		{cmd("DBSIZE"), ":0"},
		{cmd("SET k v"), "+OK"},
		{cmd("FLUSHALL SYNC"), "+OK"},
		{cmd("FLUSHALL"), "+OK"},
		{cmd("EXISTS k"), ":0"},
	})
	sec, _ := strconv.ParseInt(strings.Trim(strings.Fields(c.do("TIME"))[0], `["`), 10, 64)
	if d := time.Since(time.Unix(sec, 0)); d < -time.Minute || d > time.Minute {
		t.Errorf("TIME is %v away from the clock", d)
	}
}

// scanAll walks SCAN to its end and returns the keys, sorted.
func scanAll(t *testing.T, c *client, extra ...string) []string {
	t.Helper()
	var keys []string
	cursor := "0"
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("SCAN does not end")
		}
		reply := c.do(append([]string{"SCAN", cursor}, extra...)...)
		fields := strings.Fields(strings.Trim(reply, "[]"))
		if len(fields) == 0 {
			t.Fatalf("SCAN reply %s", reply)
		}
		cursor = strings.Trim(fields[0], `"`)
		for _, f := range fields[1:] {
			keys = append(keys, strings.Trim(f, `[]"`))
		}
		if cursor == "0" {
			break
		}
	}
	sort.Strings(keys)
	return keys
}

func TestScanAndKeys(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	c := dial(t, addr)
	var want, wantP []string
	for i := range 250 {
		k := fmt.Sprintf("key:%03d", i)
		if i%10 == 0 {
			k = fmt.Sprintf("p:%03d", i)
			wantP = append(wantP, k)
		}
		want = append(want, k)
		c.do("SET", k, "v")
	}
	sort.Strings(want)
	if got := scanAll(t, c); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("SCAN returned %d keys, want %d:\n%v", len(got), len(want), got)
	}
	if got := scanAll(t, c, "MATCH", "p*", "COUNT", "7"); strings.Join(got, " ") != strings.Join(wantP, " ") {
		t.Errorf("SCAN MATCH p* returned %v, want %v", got, wantP)
	}
	if got := scanAll(t, c, "TYPE", "string", "COUNT", "1000"); len(got) != len(want) {
		t.Errorf("SCAN TYPE string returned %d keys, want %d", len(got), len(want))
	}
	if got := scanAll(t, c, "TYPE", "hash"); len(got) != 0 {
		t.Errorf("SCAN TYPE hash returned %v", got)
	}
	run(t, c, []step{
		{cmd("KEYS p:1?0"), `["p:100" "p:110" "p:120" "p:130" "p:140" "p:150" "p:160" "p:170" "p:180" "p:190"]`},
		{cmd("KEYS p:[12]0[^0]"), "[]"},
		{cmd("KEYS p:2[0-4]0"), `["p:200" "p:210" "p:220" "p:230" "p:240"]`},
		{cmd("KEYS nothing*"), "[]"},
		{cmd("SCAN x"), "-ERR invalid cursor"},
		{cmd("SCAN 0 COUNT 0"), "-ERR syntax error"},
		{cmd("SCAN 0 COUNT x"), "-ERR value is not an integer or out of range"},
		{cmd("SCAN 0 MATCH"), "-ERR syntax error"},
		{cmd("SCAN 0 BOGUS 1"), "-ERR syntax error"},
		{[]string{"KEYS", strings.Repeat("*a", 600)}, "-ERR pattern is 1200 bytes, over the limit of 1024"},
	})
	if got := strings.Count(c.do("KEYS", "*"), `"`) / 2; got != 250 {
		t.Errorf("KEYS * returned %d keys, want 250", got)
	}
	// A pathological pattern over a long key answers (no backtracking blow-up).
	long := strings.Repeat("a", 64<<10)
	c.do("SET", long, "v")
	run(t, c, []step{{[]string{"KEYS", strings.Repeat("*a", 500) + "b"}, "[]"}})
}

// A key present from SCAN's first call to its last is returned, however
// the keyspace changes meanwhile.
func TestScanWhileKeysChange(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	c, writer := dial(t, addr), dial(t, addr)
	for i := range 100 {
		c.do("SET", fmt.Sprintf("stay:%d", i), "v")
		c.do("SET", fmt.Sprintf("go:%d", i), "v")
	}
	seen := map[string]bool{}
	cursor, round := "0", 0
	for {
		fields := strings.Fields(strings.Trim(c.do("SCAN", cursor, "COUNT", "15"), "[]"))
		cursor = strings.Trim(fields[0], `"`)
		for _, f := range fields[1:] {
			seen[strings.Trim(f, `[]"`)] = true
		}
		// Between calls, delete some keys and add others.
		for i := range 10 {
			writer.do("DEL", fmt.Sprintf("go:%d", round*10+i))
			writer.do("SET", fmt.Sprintf("new:%d:%d", round, i), "v")
		}
		round++
		if cursor == "0" {
			break
		}
	}
	for i := range 100 {
		if k := fmt.Sprintf("stay:%d", i); !seen[k] {
			t.Errorf("SCAN missed %s, present throughout", k)
		}
	}
}
