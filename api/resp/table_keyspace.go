package resp

// keyspaceCommands are the commands of transactions (MULTI, EXEC, …), key
// enumeration (SCAN, KEYS), expiry (EXPIRE, TTL, …) and key description
// (TYPE, STRLEN, MEMORY USAGE), with FLUSHDB, FLUSHALL and TIME. All but
// TYPE, TIME and the transaction commands need a Store that is a
// KeyStore, and reply an error naming what the Store lacks otherwise.
func keyspaceCommands() []*command {
	key := argKey("key")
	unixTime := func(name string) arg { return arg{name: name, typ: "unix-time"} }
	condition := optional(oneOf("condition", argToken("NX"), argToken("XX"), argToken("GT"), argToken("LT")))
	expireRun, expireCheck := expireCommand("expire", "EX")
	pexpireRun, pexpireCheck := expireCommand("pexpire", "PX")
	expireatRun, expireatCheck := expireCommand("expireat", "EXAT")
	pexpireatRun, pexpireatCheck := expireCommand("pexpireat", "PXAT")
	keyspaceWrite := []string{"@keyspace", "@write", "@fast"}
	keyspaceRead := []string{"@keyspace", "@read", "@fast"}
	txn := []string{"noscript", "loading", "stale", "fast", "allow_busy"}
	return []*command{
		{name: "multi", control: true, arity: 1, run: (*conn).multiCmd, flags: txn, acl: []string{"@fast", "@transaction"},
			doc: doc{summary: "Starts a transaction: the key commands that follow are queued, and EXEC runs them as one all-or-nothing batch.", since: "1.2.0", group: "transactions", complexity: "O(1)"}},
		{name: "exec", control: true, arity: 1, run: (*conn).execCmd, flags: []string{"noscript", "loading", "stale", "skip_slowlog"}, acl: []string{"@slow", "@transaction"},
			doc: doc{summary: "Executes the commands queued since MULTI: their writes apply all or none, and no other client's write comes between them.", since: "1.2.0", group: "transactions", complexity: "Depends on commands in the transaction"}},
		{name: "discard", control: true, arity: 1, run: (*conn).discard, flags: txn, acl: []string{"@fast", "@transaction"},
			doc: doc{summary: "Discards a transaction.", since: "2.0.0", group: "transactions", complexity: "O(N), when N is the number of queued commands"}},
		{name: "watch", control: true, arity: -2, run: (*conn).watch, flags: txn, acl: []string{"@fast", "@transaction"}, firstKey: 1, lastKey: -1, step: 1,
			doc: doc{summary: "Refused: the store keeps no key versions for EXEC to check (optimistic locking is not supported).", since: "2.2.0", group: "transactions", complexity: "O(1) for every key.", args: []arg{multiple(key)}}},
		{name: "unwatch", control: true, arity: 1, run: (*conn).unwatch, flags: txn, acl: []string{"@fast", "@transaction"},
			doc: doc{summary: "Forgets about watched keys of a transaction (there are none: WATCH is refused).", since: "2.2.0", group: "transactions", complexity: "O(1)"}},

		{name: "scan", arity: -2, run: (*conn).scan, flags: []string{"readonly"}, acl: []string{"@keyspace", "@read", "@slow"},
			doc: doc{summary: "Iterates over the key names in the database: a key present for the whole iteration is returned at least once.", since: "2.8.0", group: "generic", complexity: "O(1) for every call. O(N) for a complete iteration.",
				args: []arg{argInt("cursor"), optional(arg{name: "pattern", typ: "pattern", token: "MATCH"}), optional(arg{name: "count", typ: "integer", token: "COUNT"}), optional(arg{name: "type", typ: "string", token: "TYPE"})}}},
		{name: "keys", arity: 2, run: (*conn).keysCmd, flags: []string{"readonly"}, acl: []string{"@keyspace", "@read", "@slow", "@dangerous"},
			doc: doc{summary: "Returns all key names that match a pattern (at most 1024 bytes).", since: "1.0.0", group: "generic", complexity: "O(N) with N being the number of keys in the database", args: []arg{{name: "pattern", typ: "pattern"}}}},
		{name: "type", queue: true, arity: 2, run: (*conn).typeCmd, flags: []string{"readonly", "fast"}, acl: keyspaceRead, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Determines the type of value stored at a key: string, or none for a missing key.", since: "1.0.0", group: "generic", complexity: "O(1)", args: []arg{key}}},
		{name: "strlen", queue: true, arity: 2, run: (*conn).strlen, flags: []string{"readonly", "fast"}, acl: []string{"@read", "@string", "@fast"}, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Returns the length of a string value.", since: "2.2.0", group: "string", complexity: "O(1)", args: []arg{key}}},
		{name: "setnx", queue: true, arity: 3, run: (*conn).setnx, flags: []string{"write", "denyoom", "fast"}, acl: []string{"@write", "@string", "@fast"}, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Set the string value of a key only when the key doesn't exist.", since: "1.0.0", group: "string", complexity: "O(1)", args: []arg{key, argString("value")}}},
		{name: "setex", queue: true, check: checkSetEx("setex", "EX"), arity: 4, run: setexCommand("setex", "EX"), flags: []string{"write", "denyoom"}, acl: []string{"@write", "@string", "@slow"}, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Sets the string value and the deadline, in seconds from now, of a key.", since: "2.0.0", group: "string", complexity: "O(1)", args: []arg{key, argInt("seconds"), argString("value")}}},
		{name: "psetex", queue: true, check: checkSetEx("psetex", "PX"), arity: 4, run: setexCommand("psetex", "PX"), flags: []string{"write", "denyoom"}, acl: []string{"@write", "@string", "@slow"}, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Sets the string value and the deadline, in milliseconds from now, of a key.", since: "2.6.0", group: "string", complexity: "O(1)", args: []arg{key, argInt("milliseconds"), argString("value")}}},

		{name: "expire", queue: true, check: expireCheck, arity: -3, run: expireRun, flags: []string{"write", "fast"}, acl: keyspaceWrite, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Sets a key's deadline in seconds from now: the key is gone by then (the cache may evict it sooner).", since: "1.0.0", group: "generic", complexity: "O(1)", args: []arg{key, argInt("seconds"), condition}}},
		{name: "pexpire", queue: true, check: pexpireCheck, arity: -3, run: pexpireRun, flags: []string{"write", "fast"}, acl: keyspaceWrite, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Sets a key's deadline in milliseconds from now: the key is gone by then (the cache may evict it sooner).", since: "2.6.0", group: "generic", complexity: "O(1)", args: []arg{key, argInt("milliseconds"), condition}}},
		{name: "expireat", queue: true, check: expireatCheck, arity: -3, run: expireatRun, flags: []string{"write", "fast"}, acl: keyspaceWrite, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Sets a key's deadline as a Unix time in seconds: the key is gone by then (the cache may evict it sooner).", since: "1.2.0", group: "generic", complexity: "O(1)", args: []arg{key, unixTime("unix-time-seconds"), condition}}},
		{name: "pexpireat", queue: true, check: pexpireatCheck, arity: -3, run: pexpireatRun, flags: []string{"write", "fast"}, acl: keyspaceWrite, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Sets a key's deadline as a Unix time in milliseconds: the key is gone by then (the cache may evict it sooner).", since: "2.6.0", group: "generic", complexity: "O(1)", args: []arg{key, unixTime("unix-time-milliseconds"), condition}}},
		{name: "ttl", queue: true, arity: 2, run: (*conn).ttl, flags: []string{"readonly", "fast"}, acl: keyspaceRead, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Returns the seconds left before a key's deadline: -1 without one, -2 for a missing key.", since: "1.0.0", group: "generic", complexity: "O(1)", args: []arg{key}}},
		{name: "pttl", queue: true, arity: 2, run: (*conn).pttl, flags: []string{"readonly", "fast"}, acl: keyspaceRead, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Returns the milliseconds left before a key's deadline: -1 without one, -2 for a missing key.", since: "2.6.0", group: "generic", complexity: "O(1)", args: []arg{key}}},
		{name: "persist", queue: true, arity: 2, run: (*conn).persist, flags: []string{"write", "fast"}, acl: keyspaceWrite, firstKey: 1, lastKey: 1, step: 1,
			doc: doc{summary: "Removes a key's deadline.", since: "2.2.0", group: "generic", complexity: "O(1)", args: []arg{key}}},

		{name: "flushdb", arity: -1, run: (*conn).flush, flags: []string{"write"}, acl: []string{"@keyspace", "@write", "@slow", "@dangerous"},
			doc: doc{summary: "Removes all keys from the database (ASYNC and SYNC are accepted; both return once the keys are gone).", since: "1.0.0", group: "server", complexity: "O(N) where N is the number of keys in the selected database", args: []arg{optional(oneOf("flush-type", argToken("ASYNC"), argToken("SYNC")))}}},
		{name: "flushall", arity: -1, run: (*conn).flush, flags: []string{"write"}, acl: []string{"@keyspace", "@write", "@slow", "@dangerous"},
			doc: doc{summary: "Removes all keys from all databases: the same as FLUSHDB, as there is one.", since: "1.0.0", group: "server", complexity: "O(N) where N is the total number of keys in all databases", args: []arg{optional(oneOf("flush-type", argToken("ASYNC"), argToken("SYNC")))}}},
		{name: "memory", arity: -2, flags: []string{}, acl: []string{"@slow"},
			doc: doc{summary: "A container for memory diagnostics commands.", since: "4.0.0", group: "server", complexity: "Depends on subcommand."},
			subs: []*command{
				{name: "memory|usage", queue: true, check: checkMemoryUsage, arity: -3, run: (*conn).memoryUsage, firstKey: 2, lastKey: 2, step: 1,
					doc: doc{summary: "Estimates the memory usage of a key: the bytes the store holds for it, key and headers included.", since: "4.0.0", group: "server", complexity: "O(1)", args: []arg{key, optional(arg{name: "count", typ: "integer", token: "SAMPLES"})}}},
			}},
		{name: "time", queue: true, arity: 1, run: (*conn).timeCmd, flags: []string{"loading", "stale", "fast"}, acl: []string{"@fast"},
			doc: doc{summary: "Returns the server time.", since: "2.6.0", group: "server", complexity: "O(1)"}},
	}
}
