package resp_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/auth"
)

// testUsers is a users file for the RESP tests: a reader-writer of
// tenant acme, a reader, an operator, the user "default" that AUTH
// password alone names, and a disabled user. Hashes use the fewest
// iterations a file accepts, to keep the tests quick.
func testUsers(t testing.TB) *auth.Users {
	t.Helper()
	h := func(secret string) string {
		s, err := auth.HashSecret(secret, auth.MinIterations)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	u, err := auth.Parse(fmt.Appendf(nil, `
[[user]]
name = "alice"
secret = %q
roles = ["read", "write"]
tenant = "acme"

[[user]]
name = "reader"
secret = %q
roles = ["read"]
tenant = "acme"

[[user]]
name = "ops"
secret = %q
roles = ["read", "write", "operate"]

[[user]]
name = "default"
secret = %q
roles = ["read", "write"]

[[user]]
name = "gone"
secret = %q
roles = ["admin"]
enabled = false
`, h("alice-pw"), h("reader-pw"), h("ops-pw"), h("default-pw"), h("gone-pw")))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func authServer(t testing.TB) string {
	_, addr := startServer(t, nil, &resp.Config{Auth: testUsers(t)})
	return addr
}

const noAuth = "-NOAUTH Authentication required."
const wrongPass = "-WRONGPASS invalid username-password pair or user is disabled."

func TestWithoutAuthenticationEveryCommandAnswersNOAUTH(t *testing.T) {
	t.Parallel()
	c := dial(t, authServer(t))
	for _, cmd := range [][]string{
		{"PING"}, {"GET", "k"}, {"SET", "k", "v"}, {"EXISTS", "k"}, {"DBSIZE"}, {"SCAN", "0"}, {"KEYS", "*"},
		{"INFO"}, {"CLIENT", "LIST"}, {"COMMAND"}, {"CONFIG", "GET", "*"}, {"FLUSHALL"}, {"MULTI"}, {"ACL", "WHOAMI"},
		{"NOSUCHCOMMAND", "x"}, {"GET"}, {"CONFIG", "NOSUCH"}, // not even what is wrong with it
	} {
		if got := c.do(cmd...); got != noAuth {
			t.Errorf("%q: %s, want %s", cmd, got, noAuth)
		}
	}
	if got := c.do("HELLO", "2"); !strings.HasPrefix(got, "-NOAUTH HELLO must be called with the client already authenticated") {
		t.Errorf("HELLO 2: %s", got)
	}
	if got := c.do("HELLO", "3"); !strings.HasPrefix(got, "-NOPROTO") {
		t.Errorf("HELLO 3: %s", got)
	}
	if got := c.do("QUIT"); got != "+OK" {
		t.Errorf("QUIT: %s", got)
	}
}

func TestAUTHFollowsRedis6(t *testing.T) {
	t.Parallel()
	c := dial(t, authServer(t))
	for _, cmd := range [][]string{
		{"AUTH", "wrong"}, {"AUTH", "alice", "wrong"}, {"AUTH", "nobody", "alice-pw"}, {"AUTH", "gone", "gone-pw"},
		{"HELLO", "2", "AUTH", "alice", "wrong"},
	} {
		if got := c.do(cmd...); got != wrongPass {
			t.Errorf("%q: %s, want %s", cmd, got, wrongPass)
		}
	}
	if got := c.do("PING"); got != noAuth {
		t.Fatalf("after failed AUTHs: %s", got)
	}
	if got := c.do("AUTH", "alice", "alice-pw"); got != "+OK" {
		t.Fatalf("AUTH alice: %s", got)
	}
	for _, step := range []struct{ cmd, want string }{
		{"ACL WHOAMI", `"alice"`},
		{"PING", "+PONG"},
		{"SET k v", "+OK"},
		{"GET k", `"v"`},
		{"AUTH alice wrong", wrongPass}, // a failed AUTH leaves the connection as it was
		{"ACL WHOAMI", `"alice"`},
		{"AUTH default-pw", "+OK"}, // the password alone is the user "default"'s
		{"ACL WHOAMI", `"default"`},
		{"RESET", "+RESET"}, // and RESET forgets who the client was
		{"GET k", noAuth},
		{"ACL WHOAMI", noAuth},
	} {
		if got := c.do(strings.Fields(step.cmd)...); got != step.want {
			t.Errorf("%s: %s, want %s", step.cmd, got, step.want)
		}
	}
	got := c.do("HELLO", "2", "AUTH", "alice", "alice-pw", "SETNAME", "app")
	if !strings.Contains(got, `"proto" :2`) {
		t.Fatalf("HELLO 2 AUTH: %s", got)
	}
	if got := c.do("CLIENT", "INFO"); !strings.Contains(got, " user=alice ") || !strings.Contains(got, " name=app ") {
		t.Errorf("CLIENT INFO: %s", got)
	}
}

func TestRolesDecideWhatAUserMayRun(t *testing.T) {
	t.Parallel()
	addr := authServer(t)
	alice, reader, ops := dial(t, addr), dial(t, addr), dial(t, addr)
	for c, pw := range map[*client][]string{alice: {"alice", "alice-pw"}, reader: {"reader", "reader-pw"}, ops: {"ops", "ops-pw"}} {
		if got := c.do("AUTH", pw[0], pw[1]); got != "+OK" {
			t.Fatal(got)
		}
	}
	denied := func(user, cmd string) string {
		return fmt.Sprintf("-NOPERM User %s has no permissions to run the '%s' command", user, cmd)
	}
	for _, step := range []struct {
		c         *client
		cmd, want string
	}{
		{alice, "SET k v", "+OK"},
		{reader, "GET k", `"v"`},
		{reader, "SET k w", denied("reader", "set")},
		{reader, "DEL k", denied("reader", "del")},
		{reader, "GETDEL k", denied("reader", "getdel")},
		{reader, "EXISTS k", ":1"},
		{alice, "FLUSHDB", denied("alice", "flushdb")},
		{alice, "FLUSHALL", denied("alice", "flushall")},
		{alice, "INFO", denied("alice", "info")},
		{alice, "CLIENT LIST", denied("alice", "client|list")},
		{alice, "CLIENT ID", "/^:[0-9]+$/"},
		{ops, "INFO keyspace", `/db0:keys=1/`},
		{ops, "FLUSHALL", "+OK"},
		{alice, "GET k", "nil"},
	} {
		got := step.c.do(strings.Fields(step.cmd)...)
		if !matches(got, step.want) {
			t.Errorf("%s: %s, want %s", step.cmd, got, step.want)
		}
	}
	// A command refused in MULTI discards the transaction.
	for _, step := range []struct{ cmd, want string }{
		{"MULTI", "+OK"}, {"GET k", "+QUEUED"}, {"SET k x", denied("reader", "set")}, {"EXEC", "-EXECABORT Transaction discarded because of previous errors."},
	} {
		if got := reader.do(strings.Fields(step.cmd)...); got != step.want {
			t.Errorf("reader %s: %s, want %s", step.cmd, got, step.want)
		}
	}
}

// matches compares a reply with want, or with the regular expression
// between slashes.
func matches(got, want string) bool {
	if len(want) > 1 && strings.HasPrefix(want, "/") && strings.HasSuffix(want, "/") {
		return regexp.MustCompile(want[1 : len(want)-1]).MatchString(got)
	}
	return got == want
}

func TestWithoutAUsersFileAUTHAnswersAsRedisWithoutAPassword(t *testing.T) {
	t.Parallel()
	_, addr := startServer(t, nil, nil)
	c := dial(t, addr)
	for _, step := range []struct{ cmd, want string }{
		{"PING", "+PONG"},
		{"AUTH secret", "-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"},
		{"AUTH default anything", "+OK"},
		{"AUTH alice secret", wrongPass},
		{"ACL WHOAMI", `"default"`},
		{"FLUSHALL", "+OK"},
	} {
		if got := c.do(strings.Fields(step.cmd)...); got != step.want {
			t.Errorf("%s: %s, want %s", step.cmd, got, step.want)
		}
	}
}

// redis-cli authenticates with -a, with --user and --pass, and with AUTH
// typed in a session; without them it is refused.
func TestRedisCLIAuthenticates(t *testing.T) {
	t.Parallel()
	cli := lookTool(t, "redis-cli")
	addr := authServer(t)
	noWarning := []string{"--no-auth-warning"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"SET", "k", "v"}, "NOAUTH Authentication required.\n\n"}, // redis-cli ends an error with a blank line
		{append(noWarning, "-a", "default-pw", "SET", "k", "v"), "OK\n"},
		{append(noWarning, "--user", "alice", "--pass", "alice-pw", "ACL", "WHOAMI"), "alice\n"},
		{append(noWarning, "--user", "alice", "--pass", "wrong", "GET", "k"), "AUTH failed: WRONGPASS invalid username-password pair or user is disabled.\nNOAUTH Authentication required.\n\n"},
	} {
		if got := runTool(t, nil, "", cli, addr, tc.args...); got != tc.want {
			t.Errorf("redis-cli %s: got %q, want %q", strings.Join(tc.args, " "), got, tc.want)
		}
	}
	// REDISCLI_AUTH, as a script passes the password without showing it.
	if got := runTool(t, []string{"REDISCLI_AUTH=default-pw"}, "", cli, addr, "GET", "k"); got != "v\n" {
		t.Errorf("REDISCLI_AUTH: %q", got)
	}
	in := "GET k\nAUTH alice wrong\nAUTH alice alice-pw\nACL WHOAMI\nSET a 1\nFLUSHALL\n"
	want := "NOAUTH Authentication required.\n\nWRONGPASS invalid username-password pair or user is disabled.\n\nOK\nalice\nOK\nNOPERM User alice has no permissions to run the 'flushall' command\n\n"
	if got := runTool(t, nil, in, cli, addr); got != want {
		t.Errorf("a redis-cli session:\n%s\nwant:\n%s", got, want)
	}
}

// go-redis sends HELLO 3 AUTH user password on connecting; on NOPROTO it
// falls back to AUTH.
func TestGoRedisAuthenticates(t *testing.T) {
	t.Parallel()
	addr := authServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, o := range []*redis.Options{
		{Addr: addr, Username: "alice", Password: "alice-pw"},
		{Addr: addr, Password: "default-pw"},
		{Addr: addr, Username: "alice", Password: "alice-pw", Protocol: 2},
	} {
		rdb := redis.NewClient(o)
		if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Errorf("%s/protocol %d: SET: %v", o.Username, o.Protocol, err)
		}
		if who, err := rdb.Do(ctx, "ACL", "WHOAMI").Text(); err != nil || who != cmpOr(o.Username, "default") {
			t.Errorf("WHOAMI = %q, %v", who, err)
		}
		rdb.Close()
	}
	for _, o := range []*redis.Options{
		{Addr: addr},
		{Addr: addr, Username: "alice", Password: "wrong"},
		{Addr: addr, Password: "wrong"},
	} {
		rdb := redis.NewClient(o)
		err := rdb.Get(ctx, "k").Err()
		if err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") && !strings.HasPrefix(err.Error(), "WRONGPASS") {
			t.Errorf("user %q password %q: GET: %v, want NOAUTH or WRONGPASS", o.Username, o.Password, err)
		}
		rdb.Close()
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// redis-py with username and password, and with the redis://user:pass@
// URL LMCache passes it.
func TestRedisPyAuthenticates(t *testing.T) {
	t.Parallel()
	python := ""
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import redis").Run() == nil {
			python = py
			break
		}
	}
	if python == "" {
		t.Skip("no python3 with the redis module, skipping (Debian/Ubuntu: apt-get install python3-redis)")
	}
	addr := authServer(t)
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "testdata/redispy_auth.py", host, port).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("redispy_auth.py: %v\n%s", err, out)
	}
}
