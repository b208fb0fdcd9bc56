package resp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
)

// The key commands: GET, SET, MGET, MSET, EXISTS, DEL/UNLINK and DBSIZE.
// Each calls the Store once per key, in order; multi-key commands are not
// atomic.

func (c *conn) get(args [][]byte) {
	if st, ok := c.s.store.(Streamer); ok {
		c.getStreamed(st, string(args[1]))
		return
	}
	v, release, err := c.s.store.View(c.s.ctx, string(args[1]))
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

// setCondition is SET's NX or XX.
type setCondition int

const (
	always setCondition = iota
	ifAbsent
	ifPresent
)

func (c *conn) set(args [][]byte) {
	cond := always
	for _, opt := range args[3:] {
		switch o := string(bytes.ToUpper(opt)); o {
		case "NX", "XX":
			want := ifAbsent
			if o == "XX" {
				want = ifPresent
			}
			if cond != always && cond != want {
				c.syntaxError()
				return
			}
			cond = want
		case "EX", "PX", "EXAT", "PXAT", "KEEPTTL":
			c.error(fmt.Sprintf("ERR SET option '%s' is not supported: keys do not expire here, the cache evicts them by policy", o))
			return
		case "GET":
			c.error("ERR SET option 'GET' is not supported: send GET before SET")
			return
		default:
			c.syntaxError()
			return
		}
	}
	key, value := string(args[1]), args[2]
	if cond == always {
		if err := c.s.store.Set(c.s.ctx, key, value); err != nil {
			c.storeError(err)
			return
		}
		c.w.simple("OK")
		return
	}
	stored, err := c.setIf(key, value, cond == ifPresent)
	switch {
	case err != nil:
		c.storeError(err)
	case stored:
		c.w.simple("OK")
	default:
		c.w.null()
	}
}

// setIf stores value if key's presence equals exists: atomically where
// the Store is a ConditionalSetter, else by Exists then Set.
func (c *conn) setIf(key string, value []byte, exists bool) (bool, error) {
	if c.s.cond != nil {
		return c.s.cond.SetIf(c.s.ctx, key, value, exists)
	}
	ok, err := c.s.store.Exists(c.s.ctx, key)
	if err != nil || ok != exists {
		return false, err
	}
	return true, c.s.store.Set(c.s.ctx, key, value)
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
	for i, k := range keys {
		v, release, err := c.s.store.View(c.s.ctx, string(k))
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

func (c *conn) mset(args [][]byte) {
	if len(args)%2 == 0 {
		c.arityError("mset")
		return
	}
	for i := 1; i < len(args); i += 2 {
		if err := c.s.store.Set(c.s.ctx, string(args[i]), args[i+1]); err != nil {
			c.storeError(err)
			return
		}
	}
	c.w.simple("OK")
}

func (c *conn) exists(args [][]byte) { c.count(args[1:], c.s.store.Exists) }

func (c *conn) del(args [][]byte) { c.count(args[1:], c.s.store.Delete) }

// count replies how many of keys op reports true for, or the first error.
func (c *conn) count(keys [][]byte, op func(context.Context, string) (bool, error)) {
	var n int64
	for _, k := range keys {
		ok, err := op(c.s.ctx, string(k))
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
	n, err := c.s.store.Len(c.s.ctx)
	if err != nil {
		c.storeError(err)
		return
	}
	c.w.int(n)
}
