package resp

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"time"
)

// The key commands: GET, SET, MGET, MSET, EXISTS, DEL/UNLINK, DBSIZE,
// STRLEN, TYPE and MEMORY USAGE. They go through c.keys(): the Store, or
// inside EXEC the transaction's overlay. MSET is one KeyStore.Apply, all
// or nothing; MGET, EXISTS and DEL take their keys one by one.

func (c *conn) get(args [][]byte) {
	if st, ok := c.s.store.(Streamer); ok && c.multi.tx == nil { // in EXEC, the overlay answers
		c.getStreamed(st, string(args[1]))
		return
	}
	v, release, err := c.keys().view(string(args[1]))
	if err != nil {
		if release != nil {
			release()
		}
		if errors.Is(err, ErrNotFound) {
			c.s.st.misses.Add(1)
			c.w.null()
			return
		}
		c.storeError(err)
		return
	}
	c.s.st.hits.Add(1)
	c.w.view(v, release)
}

// parseSet reads SET's options as of now: the options to store with, or
// the error reply if they are wrong.
func parseSet(args [][]byte, now time.Time) (SetOptions, string) {
	var opts SetOptions
	cond, expiry := "", ""
	for i := 3; i < len(args); i++ {
		switch o := string(bytes.ToUpper(args[i])); o {
		case "NX", "XX":
			if cond != "" && cond != o {
				return opts, "ERR syntax error"
			}
			cond = o
			opts.Cond = SetIfAbsent
			if o == "XX" {
				opts.Cond = SetIfPresent
			}
		case "KEEPTTL":
			if expiry != "" && expiry != o {
				return opts, "ERR syntax error"
			}
			expiry, opts.KeepTTL = o, true
		case "EX", "PX", "EXAT", "PXAT":
			if expiry != "" || i+1 == len(args) {
				return opts, "ERR syntax error"
			}
			i++
			n, ok := parseInt(args[i])
			if !ok {
				return opts, errNotInteger
			}
			at, ok := deadline(o, n, now)
			if !ok || n <= 0 {
				return opts, "ERR invalid expire time in 'set' command"
			}
			expiry, opts.ExpireAt = o, at
		case "GET":
			return opts, "ERR SET option 'GET' is not supported: send GET before SET, or both in MULTI … EXEC"
		default:
			return opts, "ERR syntax error"
		}
	}
	return opts, ""
}

// deadline is the time n means for an expiry option or command: seconds
// or milliseconds from now (EX, PX), or since the Unix epoch (EXAT,
// PXAT). It fails where the time in milliseconds overflows, as Redis's
// "invalid expire time".
func deadline(unit string, n int64, now time.Time) (time.Time, bool) {
	ms := n
	if unit == "EX" || unit == "EXAT" {
		if n > math.MaxInt64/1000 || n < math.MinInt64/1000 {
			return time.Time{}, false
		}
		ms = n * 1000
	}
	if unit == "EX" || unit == "PX" {
		base := now.UnixMilli()
		if ms > 0 && base > math.MaxInt64-ms || ms < 0 && base < math.MinInt64-ms {
			return time.Time{}, false
		}
		ms += base
	}
	return time.UnixMilli(ms), true
}

func checkSet(args [][]byte) string {
	_, msg := parseSet(args, time.Now())
	return msg
}

func (c *conn) set(args [][]byte) {
	if p := c.rd.takePending(); p != nil { // a plain SET, its value read into the store's room
		if err := p.Commit(); err != nil {
			c.storeError(err)
			return
		}
		c.w.simple("OK")
		return
	}
	opts, msg := parseSet(args, c.now())
	if msg != "" {
		c.error(msg)
		return
	}
	stored, err := c.keys().setWith(string(args[1]), args[2], opts)
	switch {
	case err != nil:
		c.storeError(err)
	case stored:
		c.w.simple("OK")
	default:
		c.w.null()
	}
}

// now is the time relative deadlines count from: EXEC's start inside a
// transaction.
func (c *conn) now() time.Time {
	if c.multi.tx != nil {
		return c.multi.tx.now
	}
	return time.Now()
}

// viewed is one MGET value, held until the reply is written.
type viewed struct {
	val     []byte
	release func()
	found   bool
}

func (c *conn) mget(args [][]byte) {
	keys := args[1:]
	vals := make([]viewed, len(keys))
	ops := c.keys()
	for i, k := range keys {
		v, release, err := ops.view(string(k))
		if err != nil {
			if release != nil {
				release()
			}
			if errors.Is(err, ErrNotFound) {
				continue
			}
			for _, got := range vals[:i] {
				if got.release != nil {
					got.release()
				}
			}
			c.storeError(err)
			return
		}
		vals[i] = viewed{val: v, release: release, found: true}
	}
	c.w.array(len(vals))
	for _, v := range vals {
		if !v.found {
			c.s.st.misses.Add(1)
			c.w.null()
			continue
		}
		c.s.st.hits.Add(1)
		c.w.view(v.val, v.release)
	}
}

func checkMSet(args [][]byte) string {
	if len(args)%2 == 0 {
		return "ERR wrong number of arguments for 'mset' command"
	}
	return ""
}

// mset stores every pair, or none: one Apply.
func (c *conn) mset(args [][]byte) {
	if msg := checkMSet(args); msg != "" {
		c.error(msg)
		return
	}
	ws := make([]Write, 0, len(args)/2)
	for i := 1; i < len(args); i += 2 {
		ws = append(ws, Write{Key: string(args[i]), Value: args[i+1]})
	}
	if err := c.keys().apply(ws); err != nil {
		c.storeError(err)
		return
	}
	c.w.simple("OK")
}

func (c *conn) exists(args [][]byte) { c.count(args[1:], keyOps.exists) }

func (c *conn) del(args [][]byte) { c.count(args[1:], keyOps.del) }

// count replies how many of keys op reports true for, or the first error.
func (c *conn) count(keys [][]byte, op func(keyOps, string) (bool, error)) {
	var n int64
	ops := c.keys()
	for _, k := range keys {
		ok, err := op(ops, string(k))
		if err != nil {
			c.storeError(err)
			return
		}
		if ok {
			n++
		}
	}
	c.w.int(n)
}

func (c *conn) dbsize(args [][]byte) {
	n, err := c.s.store.Len(c.direct.ctx)
	if err != nil {
		c.storeError(err)
		return
	}
	c.w.int(n)
}

// typeCmd answers TYPE: every value is a string.
func (c *conn) typeCmd(args [][]byte) {
	ok, err := c.keys().exists(string(args[1]))
	switch {
	case err != nil:
		c.storeError(err)
	case ok:
		c.w.simple("string")
	default:
		c.w.simple("none")
	}
}

// stat describes key; found is false, with no reply written, for a
// missing key, and a Store error is replied.
func (c *conn) stat(key []byte) (info KeyInfo, found, ok bool) {
	info, err := c.keys().stat(string(key))
	switch {
	case errors.Is(err, ErrNotFound):
		return info, false, true
	case err != nil:
		c.storeError(err)
		return info, false, false
	}
	return info, true, true
}

func (c *conn) strlen(args [][]byte) {
	if info, _, ok := c.stat(args[1]); ok {
		c.w.int(info.Size) // zero for a missing key
	}
}

func checkMemoryUsage(args [][]byte) string {
	switch {
	case len(args) == 3:
		return ""
	case len(args) == 5 && bytes.EqualFold(args[3], []byte("SAMPLES")):
		if _, ok := parseInt(args[4]); !ok {
			return errNotInteger
		}
		return ""
	}
	return "ERR syntax error"
}

// memoryUsage answers MEMORY USAGE key [SAMPLES n]: the bytes the store
// holds for key, or null for a missing key.
func (c *conn) memoryUsage(args [][]byte) {
	if msg := checkMemoryUsage(args); msg != "" {
		c.error(msg)
		return
	}
	info, found, ok := c.stat(args[2])
	switch {
	case !ok:
	case !found:
		c.w.null()
	default:
		c.w.int(info.Footprint)
	}
}

// timeCmd answers TIME: seconds and microseconds since the Unix epoch.
func (c *conn) timeCmd(args [][]byte) {
	now := time.Now()
	c.w.array(2)
	c.w.bulkString(strconv.FormatInt(now.Unix(), 10))
	c.w.bulkString(strconv.FormatInt(int64(now.Nanosecond()/1000), 10))
}

func (c *conn) flush(args [][]byte) {
	if len(args) > 2 || len(args) == 2 && !bytes.EqualFold(args[1], []byte("ASYNC")) && !bytes.EqualFold(args[1], []byte("SYNC")) {
		c.syntaxError()
		return
	}
	if c.s.ks == nil {
		c.storeError(errNoScan)
		return
	}
	if _, err := c.s.ks.Flush(c.direct.ctx); err != nil {
		c.storeError(err)
		return
	}
	c.w.simple("OK")
}

// errNotInteger is Redis's reply to a number argument that is not one.
const errNotInteger = "ERR value is not an integer or out of range"

// setnx answers SETNX key value: 1 if it stored, 0 if key was present.
func (c *conn) setnx(args [][]byte) {
	stored, err := c.keys().setWith(string(args[1]), args[2], SetOptions{Cond: SetIfAbsent})
	switch {
	case err != nil:
		c.storeError(err)
	case stored:
		c.w.int(1)
	default:
		c.w.int(0)
	}
}

// parseSetEx reads SETEX's (unit EX) or PSETEX's (PX) time as of now.
func parseSetEx(name, unit string, args [][]byte, now time.Time) (time.Time, string) {
	n, ok := parseInt(args[2])
	if !ok {
		return time.Time{}, errNotInteger
	}
	at, ok := deadline(unit, n, now)
	if !ok || n <= 0 {
		return time.Time{}, "ERR invalid expire time in '" + name + "' command"
	}
	return at, ""
}

func checkSetEx(name, unit string) func([][]byte) string {
	return func(args [][]byte) string {
		_, msg := parseSetEx(name, unit, args, time.Now())
		return msg
	}
}

// setexCommand runs SETEX key seconds value (PSETEX: milliseconds).
func setexCommand(name, unit string) func(*conn, [][]byte) {
	return func(c *conn, args [][]byte) {
		at, msg := parseSetEx(name, unit, args, c.now())
		if msg != "" {
			c.error(msg)
			return
		}
		if _, err := c.keys().setWith(string(args[1]), args[3], SetOptions{ExpireAt: at}); err != nil {
			c.storeError(err)
			return
		}
		c.w.simple("OK")
	}
}
