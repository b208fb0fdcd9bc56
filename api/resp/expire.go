package resp

import (
	"errors"
	"strings"
	"time"
)

// The expiry commands: EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT, TTL, PTTL and
// PERSIST. A deadline is a promise that the key is gone by then: reads
// miss after it. The cache may still evict the key sooner.

// expireCond is EXPIRE's options: NX, XX, GT, LT (XX may come with GT or
// LT).
type expireCond struct{ nx, xx, gt, lt bool }

// parseExpire reads EXPIRE key n [NX|XX|GT|LT] (and its siblings, whose
// unit is EX, PX, EXAT or PXAT) as of now.
func parseExpire(name, unit string, args [][]byte, now time.Time) (time.Time, expireCond, string) {
	var cond expireCond
	n, ok := parseInt(args[2])
	if !ok {
		return time.Time{}, cond, errNotInteger
	}
	at, ok := deadline(unit, n, now)
	if !ok {
		return time.Time{}, cond, "ERR invalid expire time in '" + name + "' command"
	}
	for _, a := range args[3:] {
		switch strings.ToUpper(string(a)) {
		case "NX":
			cond.nx = true
		case "XX":
			cond.xx = true
		case "GT":
			cond.gt = true
		case "LT":
			cond.lt = true
		default:
			return time.Time{}, cond, "ERR Unsupported option " + string(a[:min(len(a), 128)])
		}
	}
	switch {
	case cond.nx && (cond.xx || cond.gt || cond.lt):
		return time.Time{}, cond, "ERR NX and XX, GT or LT options at the same time are not compatible"
	case cond.gt && cond.lt:
		return time.Time{}, cond, "ERR GT and LT options at the same time are not compatible"
	}
	return at, cond, ""
}

// holds reports whether cond lets the deadline at replace cur (zero: no
// deadline, which GT and LT take as an infinite one).
func (cond expireCond) holds(cur, at time.Time) bool {
	none := cur.IsZero()
	switch {
	case cond.nx && !none, cond.xx && none:
		return false
	case cond.gt && (none || !at.After(cur)):
		return false
	case cond.lt && !none && !at.Before(cur):
		return false
	}
	return true
}

// expireCommand returns the run and check functions of an expiry
// command whose number is in unit (EX, PX, EXAT, PXAT).
func expireCommand(name, unit string) (run func(*conn, [][]byte), check func([][]byte) string) {
	run = func(c *conn, args [][]byte) {
		at, cond, msg := parseExpire(name, unit, args, c.now())
		if msg != "" {
			c.error(msg)
			return
		}
		c.expire(args[1], at, cond)
	}
	check = func(args [][]byte) string {
		_, _, msg := parseExpire(name, unit, args, time.Now())
		return msg
	}
	return run, check
}

// expire sets key's deadline to at if cond holds, replying 1 if it did and
// 0 if not or if key is missing. The check of cond and the change are two
// calls to the Store: a concurrent EXPIRE of the same key may come between.
func (c *conn) expire(key []byte, at time.Time, cond expireCond) {
	if cond != (expireCond{}) {
		info, found, ok := c.stat(key)
		if !ok {
			return
		}
		if !found || !cond.holds(info.ExpireAt, at) {
			c.w.int(0)
			return
		}
	}
	_, err := c.keys().expire(string(key), at)
	switch {
	case errors.Is(err, ErrNotFound):
		c.w.int(0)
	case err != nil:
		c.storeError(err)
	default:
		c.w.int(1)
	}
}

func (c *conn) ttl(args [][]byte)  { c.timeToLive(args[1], time.Second) }
func (c *conn) pttl(args [][]byte) { c.timeToLive(args[1], time.Millisecond) }

// timeToLive replies key's time left in unit, rounded as Redis rounds:
// -2 for a missing key, -1 for one without a deadline.
func (c *conn) timeToLive(key []byte, unit time.Duration) {
	info, found, ok := c.stat(key)
	switch {
	case !ok:
	case !found:
		c.w.int(-2)
	case info.ExpireAt.IsZero():
		c.w.int(-1)
	default:
		ms := max(info.ExpireAt.Sub(c.now()).Milliseconds(), 0)
		if unit == time.Second {
			c.w.int((ms + 500) / 1000)
		} else {
			c.w.int(ms)
		}
	}
}

// persist removes key's deadline: 1 if it had one, else 0.
func (c *conn) persist(args [][]byte) {
	old, err := c.keys().expire(string(args[1]), time.Time{})
	switch {
	case errors.Is(err, ErrNotFound):
		c.w.int(0)
	case err != nil:
		c.storeError(err)
	case old.IsZero():
		c.w.int(0)
	default:
		c.w.int(1)
	}
}
