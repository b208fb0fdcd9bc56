package resp_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// step is one command and its expected reply, rendered as readReply does;
// a want between slashes is a regular expression.
type step struct {
	cmd  []string
	want string
}

func run(t *testing.T, c *client, steps []step) {
	t.Helper()
	for _, s := range steps {
		got := c.do(s.cmd...)
		if w, ok := strings.CutPrefix(s.want, "/"); ok {
			if !regexp.MustCompile(strings.TrimSuffix(w, "/")).MatchString(got) {
				t.Errorf("%q: got %s, want match of %s", s.cmd, got, s.want)
			}
		} else if got != s.want {
			t.Errorf("%q: got %s\nwant %s", s.cmd, got, s.want)
		}
	}
}

func cmd(words string) []string { return strings.Fields(words) }

func TestKeyCommands(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	run(t, dial(t, addr), []step{
		{cmd("GET k"), "nil"},
		{cmd("SET k v"), "+OK"},
		{cmd("GET k"), `"v"`},
		{[]string{"SET", "k", "a\r\nb\x00"}, "+OK"},
		{cmd("GET k"), `"a\r\nb\x00"`},
		{cmd("get k"), `"a\r\nb\x00"`},
		{cmd("gEt nope"), "nil"},
		{cmd("SET n v NX"), "+OK"},
		{cmd("SET n w NX"), "nil"},
		{cmd("GET n"), `"v"`},
		{cmd("SET n w XX"), "+OK"},
		{cmd("SET absent w xx"), "nil"},
		{cmd("GET n"), `"w"`},
		{cmd("SET n v NX NX"), "nil"},
		{cmd("SET k v NX XX"), "-ERR syntax error"},
		{cmd("SET k v FOO"), "-ERR syntax error"},
		{cmd("MSET a 1 b 2 c 3"), "+OK"},
		{cmd("MGET a nope c"), `["1" nil "3"]`},
		{cmd("MSET a 1 b"), "-ERR wrong number of arguments for 'mset' command"},
		{cmd("EXISTS a b nope a"), ":3"},
		{cmd("DBSIZE"), ":5"},
		{cmd("DEL a nope"), ":1"},
		{cmd("UNLINK b c c"), ":2"},
		{cmd("EXISTS a b c"), ":0"},
		{cmd("DBSIZE"), ":2"},
	})
}

// A store without deadlines (no KeyStore) refuses SET's expiry options,
// and stores nothing.
func TestSetExpiryRefusedWithoutKeyStore(t *testing.T) {
	_, addr := startServer(t, plainStore{resptest.NewMemStore()}, nil)
	c := dial(t, addr)
	for _, opt := range []string{"EX 10", "PX 100", "EXAT 1700000000", "PXAT 1700000000000", "KEEPTTL", "ex 10", "NX EX 10"} {
		got := c.do(append(cmd("SET k v"), cmd(opt)...)...)
		if want := "-ERR SET needs a store that keeps deadlines (resp.KeyStore); this server's store cannot, its keys never expire"; got != want {
			t.Errorf("SET k v %s: got %s, want %s", opt, got, want)
		}
	}
	run(t, c, []step{
		{cmd("SET k v GET"), "-ERR SET option 'GET' is not supported: send GET before SET, or both in MULTI … EXEC"},
		{cmd("EXISTS k"), ":0"},
	})
}

func TestConnectionCommands(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	run(t, dial(t, addr), []step{
		{cmd("PING"), "+PONG"},
		{cmd("ping hello"), `"hello"`},
		{cmd("PING a b"), "-ERR wrong number of arguments for 'ping' command"},
		{cmd("ECHO hi"), `"hi"`},
		{cmd("SELECT 0"), "+OK"},
		{cmd("SELECT 1"), "-ERR DB index is out of range: this server has only database 0"},
		{cmd("SELECT x"), "-ERR value is not an integer or out of range"},
		{cmd("CLIENT GETNAME"), "nil"},
		{cmd("CLIENT SETNAME worker-1"), "+OK"},
		{cmd("client getname"), `"worker-1"`},
		{[]string{"CLIENT", "SETNAME", "a b"}, "-ERR Client names cannot contain spaces, newlines or special characters."},
		{cmd("CLIENT ID"), "/^:[0-9]+$/"},
		{cmd("CLIENT SETINFO LIB-NAME redis-py"), "+OK"},
		{cmd("CLIENT SETINFO lib-ver 5.0.1"), "+OK"},
		{cmd("CLIENT SETINFO LIB-FOO x"), "-ERR Unrecognized option 'LIB-FOO'"},
		{cmd("CLIENT INFO"), `/^"id=[0-9]+ addr=127.0.0.1:[0-9]+ .*name=worker-1 .*cmd=client\|info .*lib-name=redis-py lib-ver=5.0.1\\n"$/`},
		{cmd("CLIENT LIST"), `/^"id=[0-9]+ addr=.* name=worker-1 .*\\n"$/`},
		{cmd("CLIENT LIST TYPE pubsub"), `""`},
		{cmd("CLIENT NOPE"), "-ERR unknown subcommand 'NOPE'. Try CLIENT HELP."},
		{cmd("CLIENT"), "-ERR wrong number of arguments for 'client' command"},
		{cmd("CLIENT SETNAME"), "-ERR wrong number of arguments for 'client|setname' command"},
		{cmd("CLIENT HELP"), "/^\\[\\+CLIENT <subcommand> .* \\+SETNAME \\+    Sets the connection name.*\\]$/"},
		{cmd("HELLO"), `/^\["server" "redis" "version" "7.0.0" "proto" :2 "id" :[0-9]+ "mode" "standalone" "role" "master" "modules" \[\]\]$/`},
		{cmd("HELLO 3"), "-NOPROTO unsupported protocol version: this server speaks RESP2 only"},
		{cmd("HELLO x"), "-ERR Protocol version is not an integer or out of range"},
		{cmd("HELLO 2 AUTH default secret SETNAME via-hello"), `/^\["server" .*\]$/`},
		{cmd("CLIENT GETNAME"), `"via-hello"`},
		{cmd("HELLO 2 AUTH alice secret"), "-WRONGPASS invalid username-password pair or user is disabled."},
		{cmd("HELLO 2 BOGUS"), "-ERR Syntax error in HELLO option 'BOGUS'"},
		{cmd("AUTH secret"), "-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"},
		{cmd("AUTH default secret"), "+OK"},
		{cmd("RESET"), "+RESET"},
		{cmd("CLIENT GETNAME"), "nil"},
	})
}

func TestUnknownCommandsAndWrongArity(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	run(t, dial(t, addr), []step{
		{cmd("FOO"), "-ERR unknown command 'FOO', with args beginning with: "},
		{cmd("foo a b"), "-ERR unknown command 'foo', with args beginning with: 'a' 'b' "},
		{cmd("LPUSH l x"), "-ERR unknown command 'LPUSH', with args beginning with: 'l' 'x' (kvstrata serves string values with GET, SET, MGET, MSET, DEL, EXPIRE and SCAN; lists are not supported)"},
		{[]string{"FOO", "line\r\nbreak"}, "-ERR unknown command 'FOO', with args beginning with: 'line  break' "},
		{cmd("GET"), "-ERR wrong number of arguments for 'get' command"},
		{cmd("get a b"), "-ERR wrong number of arguments for 'get' command"},
		{cmd("SET k"), "-ERR wrong number of arguments for 'set' command"},
		{cmd("MGET"), "-ERR wrong number of arguments for 'mget' command"},
		{cmd("ECHO"), "-ERR wrong number of arguments for 'echo' command"},
		{cmd("PING"), "+PONG"}, // and the connection still works
	})
}

func TestIntrospectionCommands(t *testing.T) {
	_, addr := startServer(t, nil, &resp.Config{MaxClients: 123})
	run(t, dial(t, addr), []step{
		// redis-benchmark reads these two when it starts.
		{cmd("CONFIG GET save"), `["save" ""]`},
		{cmd("CONFIG GET appendonly"), `["appendonly" "no"]`},
		{cmd("CONFIG GET maxclients SAVE max*"), `["maxclients" "123" "save" "" "maxmemory" "0"]`},
		{cmd("CONFIG GET nosuch"), "[]"},
		{cmd("CONFIG SET save x"), "-ERR unknown subcommand 'SET'. Try CONFIG HELP."},
		{cmd("COMMAND COUNT"), ":53"},
		{cmd("COMMAND INFO get nosuch"), `[["get" :2 [+readonly +fast] :1 :1 :1 [+@read +@string +@fast] [] [] []] nil]`},
		{cmd("COMMAND INFO mset"), `[["mset" :-3 [+write +denyoom] :1 :-1 :2 [+@write +@string +@slow] [] [] []]]`},
		{cmd("COMMAND DOCS get"), `["get" ["summary" "Returns the string value of a key." "since" "1.0.0" "group" "string" "complexity" "O(1)" "arguments" [["name" "key" "type" "key"]]]]`},
		{cmd("COMMAND DOCS nosuch"), "[]"},
		{cmd("COMMAND DOCS client|setname"), `["client|setname" ["summary" "Sets the connection name." "since" "2.6.9" "group" "connection" "complexity" "O(1)" "arguments" [["name" "connection-name" "type" "string"]]]]`},
		{cmd("COMMAND LIST"), `/^\["get" "set" "mget" .* "client" "multi" .* "time" "cluster" "readonly" "readwrite" "incr" .* "getdel" "acl"\]$/`},
		{cmd("COMMAND"), `/^\[\["get" :2 .*\["client\|help" :2 .*\]$/`},
		{cmd("DBSIZE"), ":0"},
	})
}

func TestInfo(t *testing.T) {
	store := resptest.NewMemStore()
	srv, addr := startServer(t, store, &resp.Config{Version: "v1.2.3"})
	c := dial(t, addr)
	run(t, c, []step{{cmd("MSET a 1 b 2"), "+OK"}, {cmd("GET a"), `"1"`}, {cmd("GET x"), "nil"}})
	info := c.do("INFO")
	for _, want := range []string{
		`"# Server\r\nredis_version:7.0.0\r\n`, "\\r\\nkvstrata_version:v1.2.3\\r\\n", "\\r\\ntcp_port:",
		"\\r\\n\\r\\n# Clients\\r\\nconnected_clients:1\\r\\n",
		"\\r\\n\\r\\n# Memory\\r\\n", "memstore_used_bytes:2\\r\\n",
		"\\r\\n\\r\\n# Stats\\r\\n", "keyspace_hits:1\\r\\nkeyspace_misses:1\\r\\n",
		"\\r\\n\\r\\n# Keyspace\\r\\ndb0:keys=2,expires=0,avg_ttl=0\\r\\n",
		"\\r\\n\\r\\n# Memstore\\r\\ncapacity_bytes:0\\r\\n",
	} {
		if !strings.Contains(info, want) {
			t.Errorf("INFO lacks %s:\n%s", want, info)
		}
	}
	if strings.Contains(info, "Commandstats") {
		t.Errorf("INFO without arguments reports commandstats:\n%s", info)
	}
	run(t, c, []step{
		{cmd("INFO keyspace"), `"# Keyspace\r\ndb0:keys=2,expires=0,avg_ttl=0\r\n"`},
		{cmd("INFO KEYSPACE memstore"), `"# Keyspace\r\ndb0:keys=2,expires=0,avg_ttl=0\r\n\r\n# Memstore\r\ncapacity_bytes:0\r\nmax_value_bytes:0\r\nopen_views:0\r\n"`},
		{cmd("INFO nosuch"), `""`},
		{cmd("INFO all"), `/# Commandstats\\r\\ncmdstat_get:calls=2\\r\\ncmdstat_mset:calls=1\\r\\n.*cmdstat_info:calls=[0-9]+/`},
	})
	if st := srv.Stats(); st.KeyspaceHits != 1 || st.KeyspaceMisses != 1 {
		t.Errorf("Stats hits/misses = %d/%d, want 1/1", st.KeyspaceHits, st.KeyspaceMisses)
	}
}

func TestInlineCommands(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	c := dial(t, addr)
	c.sendRaw("SET greeting \"hello world\"\r\nGET greeting\nget 'greeting'\r\n\r\nPING\r\nEXISTS greeting nope\r\n")
	for _, want := range []string{"+OK", `"hello world"`, `"hello world"`, "+PONG", ":1"} {
		if got := c.read(); got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}

func TestQuitRepliesAndCloses(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	c := dial(t, addr)
	if got := c.do("QUIT"); got != "+OK" {
		t.Fatalf("QUIT: %s", got)
	}
	if !c.closed() {
		t.Fatal("connection still open after QUIT")
	}
}

// Store errors become replies a person can act on, and the connection
// stays usable.
func TestStoreErrorReplies(t *testing.T) {
	store := resptest.NewMemStore()
	store.MaxValue, store.Capacity = 4<<20, 6<<20
	_, addr := startServer(t, store, nil)
	c := dial(t, addr)
	run(t, c, []step{
		{[]string{"SET", "big", strings.Repeat("x", 5<<20)}, "-ERR resptest: value is 5.0 MiB, over the 4.0 MiB limit"},
		{[]string{"SET", "a", strings.Repeat("x", 4<<20)}, "+OK"},
		{[]string{"SET", "b", strings.Repeat("x", 4<<20)}, "-OOM resptest: resp: store full: 4.0 MiB of 6.0 MiB used, 4.0 MiB more do not fit"},
		{[]string{"MSET", "c", "1", "d", strings.Repeat("x", 5<<20)}, "-ERR resptest: value is 5.0 MiB, over the 4.0 MiB limit"},
		{cmd("EXISTS c d"), ":0"}, // MSET is all or nothing
	})
	for _, tc := range []struct {
		err  error
		want string
	}{
		{errors.New("ssd: read block 7: input/output error"), "-ERR ssd: read block 7: input/output error"},
		{resp.ErrFull, "-OOM the store is full and cannot make room for this value"},
		{resp.ErrTooLarge, "-ERR value is over the store's size limit"},
		{resp.Mark(errors.New("tiers: tier full"), resp.ErrFull), "-OOM tiers: tier full"},
		{resp.Mark(errors.New("s3: store unavailable"), resp.ErrUnavailable), "-TRYAGAIN s3: store unavailable"},
		{errors.New("two\r\nlines"), "-ERR two  lines"},
	} {
		store.FailWith(tc.err)
		for _, words := range []string{"GET a", "SET a v", "MGET a b", "EXISTS a", "DEL a", "DBSIZE", "SET a v NX"} {
			if got := c.do(cmd(words)...); got != tc.want {
				t.Errorf("%s failing with %q: got %s, want %s", words, tc.err, got, tc.want)
			}
		}
	}
	store.FailWith(nil)
	run(t, c, []step{{cmd("DBSIZE"), ":1"}})
}

func TestMarkKeepsTextAndAddsKind(t *testing.T) {
	base := errors.New("tiers: block is 5.0 MiB, over the 4.0 MiB limit")
	err := resp.Mark(base, resp.ErrTooLarge)
	if err.Error() != base.Error() || !errors.Is(err, resp.ErrTooLarge) || !errors.Is(err, base) || errors.Is(err, resp.ErrFull) {
		t.Fatalf("Mark(%v, ErrTooLarge) = %v; Is TooLarge %v, Is base %v", base, err, errors.Is(err, resp.ErrTooLarge), errors.Is(err, base))
	}
	if resp.Mark(nil, resp.ErrFull) != nil {
		t.Fatal("Mark(nil) is not nil")
	}
}

// plainStore hides MemStore's ConditionalSetter, so the server falls back
// to Exists then Set for NX and XX.
type plainStore struct{ resp.Store }

func TestSetNXAndXXWithoutConditionalSetter(t *testing.T) {
	_, addr := startServer(t, plainStore{resptest.NewMemStore()}, nil)
	run(t, dial(t, addr), []step{
		{cmd("SET k v XX"), "nil"},
		{cmd("SET k v NX"), "+OK"},
		{cmd("SET k w NX"), "nil"},
		{cmd("SET k w XX"), "+OK"},
		{cmd("GET k"), `"w"`},
	})
}

// Every value View hands out is released once it has been written.
func TestViewsAreReleased(t *testing.T) {
	store := resptest.NewMemStore()
	_, addr := startServer(t, store, nil)
	c := dial(t, addr)
	small, big := "tiny", strings.Repeat("v", 1<<20)
	run(t, c, []step{{[]string{"MSET", "s", small, "b", big}, "+OK"}})
	for range 3 {
		c.send("GET", "b")
		c.send("GET", "s")
		c.send("MGET", "b", "s", "nope", "b")
	}
	c.flush()
	for range 9 {
		c.read()
	}
	waitFor(t, "all views released", func() bool { return store.OpenViews() == 0 })
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
