package resp

import (
	"bytes"
	"strconv"
)

// SCAN and KEYS, through KeyStore.Scan. Every value is a string, so SCAN
// … TYPE string lists every key and any other type none.

// defaultScanCount is SCAN's COUNT when the client gives none, as Redis.
const defaultScanCount = 10

// keysBatch is how many keys KEYS asks the Store for at a time.
const keysBatch = 1000

func (c *conn) scan(args [][]byte) {
	cursor, err := strconv.ParseUint(string(args[1]), 10, 64)
	if err != nil {
		c.error("ERR invalid cursor")
		return
	}
	count, match, onlyNone := defaultScanCount, (*glob)(nil), false
	for i := 2; i < len(args); i += 2 {
		if i+1 == len(args) {
			c.syntaxError()
			return
		}
		v := args[i+1]
		switch {
		case bytes.EqualFold(args[i], []byte("COUNT")):
			n, ok := parseInt(v)
			if !ok {
				c.error(errNotInteger)
				return
			}
			if n < 1 {
				c.syntaxError()
				return
			}
			count = int(min(n, 1<<20))
		case bytes.EqualFold(args[i], []byte("MATCH")):
			g, err := compileGlob(v)
			if err != nil {
				c.error("ERR " + err.Error())
				return
			}
			match = g
		case bytes.EqualFold(args[i], []byte("TYPE")):
			onlyNone = !bytes.EqualFold(v, []byte("string"))
		default:
			c.syntaxError()
			return
		}
	}
	if c.s.ks == nil {
		c.storeError(errNoScan)
		return
	}
	keys, next, err := c.s.ks.Scan(c.direct.ctx, cursor, count)
	if err != nil {
		c.storeError(err)
		return
	}
	out := keys[:0]
	for _, k := range keys {
		if !onlyNone && (match == nil || match.match(k)) {
			out = append(out, k)
		}
	}
	c.w.array(2)
	c.w.bulkString(strconv.FormatUint(next, 10))
	c.w.stringArray(out)
}

// keysCmd answers KEYS pattern: every key that matches, each once.
func (c *conn) keysCmd(args [][]byte) {
	match, err := compileGlob(args[1])
	if err != nil {
		c.error("ERR " + err.Error())
		return
	}
	if c.s.ks == nil {
		c.storeError(errNoScan)
		return
	}
	seen := map[string]bool{}
	var out []string
	for cursor := uint64(0); ; {
		keys, next, err := c.s.ks.Scan(c.direct.ctx, cursor, keysBatch)
		if err != nil {
			c.storeError(err)
			return
		}
		for _, k := range keys {
			if !seen[k] && match.match(k) {
				seen[k] = true
				out = append(out, k)
			}
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	c.w.stringArray(out)
}
