package resp_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// These tests drive the server with the real Redis tools (Debian package
// redis-tools): what works for them works for Redis clients at large.

func lookTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not found, skipping (Debian/Ubuntu: apt-get install redis-tools): %v", name, err)
	}
	return path
}

// runTool runs a tool against the server at addr and returns its output.
func runTool(t *testing.T, env []string, stdin string, tool, addr string, args ...string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool, append([]string{"-h", host, "-p", port}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestRedisCLI(t *testing.T) {
	cli := lookTool(t, "redis-cli")
	_, addr := startServer(t, nil, nil)
	for _, tc := range []struct{ args, want string }{
		{"PING", "PONG\n"},
		{"SET k v", "OK\n"},
		{"GET k", "v\n"},
		{"MSET a 1 b 2", "OK\n"},
		{"MGET a b nope", "1\n2\n\n"},
		{"EXISTS a b nope", "2\n"},
		{"DEL a nope", "1\n"},
		{"UNLINK b", "1\n"},
		{"DBSIZE", "1\n"},
		{"SET k v EX 10", "OK\n"},
		{"TTL k", "10\n"},
		{"CONFIG GET appendonly", "appendonly\nno\n"},
	} {
		if got := runTool(t, nil, "", cli, addr, strings.Fields(tc.args)...); got != tc.want {
			t.Errorf("redis-cli %s: got %q, want %q", tc.args, got, tc.want)
		}
	}
	if got := runTool(t, nil, "", cli, addr, "INFO"); !strings.Contains(got, "redis_version:7.0.0") || !strings.Contains(got, "db0:keys=1,") {
		t.Errorf("redis-cli INFO:\n%s", got)
	}

	// Several commands through stdin, answers formatted as in a terminal.
	in := "SET x 1\nGET x\nMGET x nope\nSET \"a key\" \"a value\"\nGET \"a key\"\nINCR x\nLPUSH l x\nDBSIZE\n"
	want := `OK
"1"
1) "1"
2) (nil)
OK
"a value"
(integer) 2
(error) ERR unknown command 'LPUSH', with args beginning with: 'l' 'x' (kvstrata serves string values with GET, SET, MGET, MSET, DEL, EXPIRE and SCAN; lists are not supported)
(integer) 3
`
	if got := runTool(t, nil, in, cli, addr, "--no-raw"); got != want {
		t.Errorf("redis-cli --no-raw with commands on stdin:\ngot:\n%s\nwant:\n%s", got, want)
	}
}

// Interactive redis-cli builds its help and hints from COMMAND DOCS, and
// asserts on its shape: a malformed reply would abort it.
func TestRedisCLIInteractiveHelp(t *testing.T) {
	lookTool(t, "redis-cli")
	script := lookTool(t, "script") // gives redis-cli the terminal it wants
	_, addr := startServer(t, nil, nil)
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, "-qec", "redis-cli -h "+host+" -p "+port, "/dev/null")
	cmd.Env = append(cmd.Environ(), "TERM=dumb") // plain line editing, no cursor queries
	cmd.Stdin = strings.NewReader("help set\nhelp client setname\nquit\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("interactive redis-cli: %v\n%s", err, out)
	}
	for _, want := range []string{"SET\x1b[0m \x1b[90mkey value [NX|XX]", "CLIENT SETNAME\x1b[0m \x1b[90mconnection-name", "summary:\x1b[0m Sets the connection name."} {
		if !strings.Contains(string(out), want) {
			t.Errorf("help lacks %q:\n%q", want, out)
		}
	}
}

var rps = regexp.MustCompile(`(?m)^(SET|GET): ([0-9.]+) requests per second`)

func TestRedisBenchmark(t *testing.T) {
	bench := lookTool(t, "redis-benchmark")
	cli := lookTool(t, "redis-cli")
	store := resptest.NewMemStore()
	srv, addr := startServer(t, store, nil)
	for _, flags := range []string{"-t set,get -n 2000 -d 65536 -q", "-t set,get -n 2000 -d 65536 -P 16 -q", "-t set,get -n 20000 -d 100 -c 20 -P 16 -q"} {
		out := runTool(t, nil, "", bench, addr, strings.Fields(flags)...)
		// Progress lines end in \r; keep what follows the last one.
		var lines []string
		for _, l := range strings.Split(out, "\n") {
			lines = append(lines, l[strings.LastIndex(l, "\r")+1:])
		}
		final := strings.Join(lines, "\n")
		got := rps.FindAllStringSubmatch(final, -1)
		if len(got) != 2 || got[0][1] != "SET" || got[1][1] != "GET" || got[0][2] == "0.00" || got[1][2] == "0.00" {
			t.Errorf("redis-benchmark %s: no SET and GET rates in:\n%s", flags, final)
		}
		if strings.Contains(final, "rror") || strings.Contains(final, "WARN") {
			t.Errorf("redis-benchmark %s reported errors:\n%s", flags, final)
		}
		t.Logf("redis-benchmark %s:%s", flags, strings.Join(lines, " "))
	}
	// redis-benchmark wrote its values under one key; the last arrived whole.
	if v := runTool(t, nil, "", cli, addr, "GET", "key:__rand_int__"); len(v) != 100+1 {
		t.Errorf("benchmark value is %d bytes, want 100", len(v)-1)
	}
	if st := srv.Stats(); st.ProtocolErrors != 0 || st.ErrorReplies != 0 {
		t.Errorf("stats after the benchmarks: %+v", st)
	}
	waitFor(t, "all views released", func() bool { return store.OpenViews() == 0 })
}

// The keyspace tools of redis-cli, and LMCache's operations guide (KEYS,
// MEMORY USAGE, --scan --pattern … | xargs DEL), work as on Redis.
func TestRedisCLIKeyspaceTools(t *testing.T) {
	cli := lookTool(t, "redis-cli")
	_, addr := startServer(t, nil, nil)
	host, port, _ := net.SplitHostPort(addr)
	c := dial(t, addr)
	var all []string
	for i := range 120 {
		k := fmt.Sprintf("chunk:%03d", i)
		if i%4 == 0 {
			k = fmt.Sprintf("prompt:%03d", i)
		}
		all = append(all, k)
		c.do("SET", k, strings.Repeat("v", i))
	}
	c.do("SET", "big", strings.Repeat("b", 100000))
	all = append(all, "big")
	sort.Strings(all)

	lines := func(out string) []string {
		ls := strings.Fields(out)
		sort.Strings(ls)
		return ls
	}
	if got := lines(runTool(t, nil, "", cli, addr, "--scan")); strings.Join(got, " ") != strings.Join(all, " ") {
		t.Errorf("redis-cli --scan listed %d keys, want %d", len(got), len(all))
	}
	if got := lines(runTool(t, nil, "", cli, addr, "--scan", "--pattern", "prompt:*")); len(got) != 30 {
		t.Errorf("redis-cli --scan --pattern prompt:* listed %d keys, want 30: %v", len(got), got)
	}
	if got := lines(runTool(t, nil, "", cli, addr, "KEYS", "*")); len(got) != len(all) {
		t.Errorf("redis-cli KEYS * listed %d keys, want %d", len(got), len(all))
	}
	if got := runTool(t, nil, "", cli, addr, "MEMORY", "USAGE", "big"); got != fmt.Sprintf("%d\n", 3+100000+resptest.EntryOverhead) {
		t.Errorf("redis-cli MEMORY USAGE big: %q", got)
	}
	if got := runTool(t, nil, "", cli, addr, "--bigkeys"); !strings.Contains(got, "Biggest string found '\"big\"' has 100000 bytes") || !strings.Contains(got, fmt.Sprintf("Sampled %d keys", len(all))) {
		t.Errorf("redis-cli --bigkeys:\n%s", got)
	}
	if got := runTool(t, nil, "", cli, addr, "--memkeys"); !strings.Contains(got, fmt.Sprintf("Biggest string found '\"big\"' has %d bytes", 3+100000+resptest.EntryOverhead)) {
		t.Errorf("redis-cli --memkeys:\n%s", got)
	}

	// The guide's way to drop keys by prefix.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	script := fmt.Sprintf("%[1]s -h %[2]s -p %[3]s --scan --pattern 'prompt:*' | xargs %[1]s -h %[2]s -p %[3]s DEL", cli, host, port)
	out, err := exec.CommandContext(ctx, "sh", "-c", script).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "30" {
		t.Fatalf("%s: %v, %q; want 30 keys deleted", script, err, out)
	}
	if got := runTool(t, nil, "", cli, addr, "DBSIZE"); got != fmt.Sprintf("%d\n", len(all)-30) {
		t.Errorf("DBSIZE after the DEL: %q, want %d", got, len(all)-30)
	}
	if got := runTool(t, nil, "", cli, addr, "--scan", "--pattern", "prompt:*"); got != "" {
		t.Errorf("prompt:* keys left: %q", got)
	}
	for _, tc := range []struct{ args, want string }{
		{"SET t v EX 100", "OK\n"},
		{"TTL t", "100\n"},
		{"PERSIST t", "1\n"},
		{"TYPE t", "string\n"},
		{"STRLEN t", "1\n"},
		{"CONFIG GET maxmemory", "maxmemory\n0\n"},
		{"FLUSHALL", "OK\n"},
		{"DBSIZE", "0\n"},
	} {
		if got := runTool(t, nil, "", cli, addr, strings.Fields(tc.args)...); got != tc.want {
			t.Errorf("redis-cli %s: got %q, want %q", tc.args, got, tc.want)
		}
	}
}

// redis-benchmark exits at the first error reply it gets (outside cluster
// mode), so plain redis-benchmark -q runs PING, SET, GET and INCR and
// stops at LPUSH, the first command of a type not served, with the
// server's reason.
// The string commands' tests all run.
func TestRedisBenchmarkDefaultTests(t *testing.T) {
	bench := lookTool(t, "redis-benchmark")
	_, addr := startServer(t, nil, nil)
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bench, "-h", host, "-p", port, "-q", "-n", "2000").CombinedOutput()
	final := benchLines(string(out))
	if err == nil || !strings.Contains(final, "Error from server: ERR unknown command 'LPUSH', with args beginning with: 'mylist'") {
		t.Errorf("plain redis-benchmark -q: %v\n%s", err, final)
	}
	for _, test := range []string{"PING_INLINE", "PING_MBULK", "SET", "GET", "INCR"} {
		if !regexp.MustCompile(`(?m)^` + test + `: [0-9.]+ requests per second`).MatchString(final) {
			t.Errorf("plain redis-benchmark -q has no %s rate:\n%s", test, final)
		}
	}
	final = benchLines(runTool(t, nil, "", bench, addr, "-q", "-n", "2000", "-t", "ping,set,get,mset"))
	for _, test := range []string{"PING_INLINE", "PING_MBULK", "SET", "GET", `MSET \(10 keys\)`} {
		if !regexp.MustCompile(`(?m)^` + test + `: [0-9.]+ requests per second`).MatchString(final) {
			t.Errorf("redis-benchmark -q -t ping,set,get,mset has no %s rate:\n%s", test, final)
		}
	}
	if strings.Contains(final, "rror") {
		t.Errorf("redis-benchmark -t ping,set,get,mset reported errors:\n%s", final)
	}
}

// benchLines drops redis-benchmark's progress lines (each ends in \r).
func benchLines(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		lines = append(lines, l[strings.LastIndex(l, "\r")+1:])
	}
	return strings.Join(lines, "\n")
}
