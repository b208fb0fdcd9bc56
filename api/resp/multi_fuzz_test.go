package resp_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// multiModel is what a Redis server answers to the commands FuzzMulti
// sends: a map of strings, and MULTI's queue.
type multiModel struct {
	m       map[string]string
	active  bool
	aborted bool
	queued  [][]string
}

const execAbort = "-EXECABORT Transaction discarded because of previous errors."

// do returns the model's reply to args, rendered as readReply renders.
func (mm *multiModel) do(args []string) string {
	name := strings.ToUpper(args[0])
	switch name {
	case "MULTI":
		if mm.active {
			mm.aborted = true
			return "-ERR MULTI calls can not be nested"
		}
		mm.active, mm.aborted, mm.queued = true, false, nil
		return "+OK"
	case "EXEC":
		if !mm.active {
			return "-ERR EXEC without MULTI"
		}
		mm.active = false
		if mm.aborted {
			return execAbort
		}
		var replies []string
		for _, q := range mm.queued {
			replies = append(replies, mm.run(q))
		}
		return "[" + strings.Join(replies, " ") + "]"
	case "DISCARD":
		if !mm.active {
			return "-ERR DISCARD without MULTI"
		}
		mm.active = false
		return "+OK"
	}
	if name == "SET" && len(args) != 3 {
		mm.aborted = mm.aborted || mm.active
		return "-ERR wrong number of arguments for 'set' command"
	}
	if mm.active {
		mm.queued = append(mm.queued, args)
		return "+QUEUED"
	}
	return mm.run(args)
}

func (mm *multiModel) run(args []string) string {
	switch strings.ToUpper(args[0]) {
	case "SET":
		mm.m[args[1]] = args[2]
		return "+OK"
	case "MSET":
		for i := 1; i < len(args); i += 2 {
			mm.m[args[i]] = args[i+1]
		}
		return "+OK"
	case "GET":
		if v, ok := mm.m[args[1]]; ok {
			return fmt.Sprintf("%q", v)
		}
		return "nil"
	case "DEL", "EXISTS":
		n := 0
		for _, k := range args[1:] {
			if _, ok := mm.m[k]; ok {
				n++
				if strings.ToUpper(args[0]) == "DEL" {
					delete(mm.m, k)
				}
			}
		}
		return fmt.Sprintf(":%d", n)
	}
	panic("model: " + args[0])
}

// FuzzMulti sends sequences of key commands in and out of MULTI, with
// commands refused while queueing, and checks every reply, and the keys
// at the end, against a model of Redis.
func FuzzMulti(f *testing.F) {
	f.Add([]byte{3, 0, 0x11, 4, 1, 0x21})
	f.Add([]byte{3, 0, 6, 0x10, 4, 8})
	f.Add([]byte{3, 7, 2, 5, 4, 3, 3, 4, 8})
	_, addr := startServer(f, nil, nil)
	keys := []string{"a", "b", "c"}
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			return
		}
		c := dial(t, addr)
		defer c.nc.Close()
		c.do("FLUSHALL")
		mm := &multiModel{m: map[string]string{}}
		for i, op := range ops {
			k, k2 := keys[int(op>>4)%3], keys[int(op>>6)%3]
			v := fmt.Sprint(i)
			var args []string
			switch op % 9 {
			case 0:
				args = []string{"SET", k, v}
			case 1:
				args = []string{"GET", k}
			case 2:
				args = []string{"DEL", k, k2}
			case 3:
				args = []string{"MULTI"}
			case 4:
				args = []string{"EXEC"}
			case 5:
				args = []string{"DISCARD"}
			case 6:
				args = []string{"SET", k}
			case 7:
				args = []string{"MSET", k, v, k2, v + "'"}
			case 8:
				args = []string{"EXISTS", "a", "b", "c"}
			}
			if got, want := c.do(args...), mm.do(args); got != want {
				t.Fatalf("op %d %q: got %s, want %s", i, args, got, want)
			}
		}
		if mm.active {
			c.do("DISCARD")
		}
		var want []string
		for _, k := range keys {
			if v, ok := mm.m[k]; ok {
				want = append(want, fmt.Sprintf("%s=%q", k, v))
			}
		}
		var got []string
		for _, k := range keys {
			if r := c.do("GET", k); r != "nil" {
				got = append(got, k+"="+r)
			}
		}
		sort.Strings(got)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("keys at the end: %v, want %v", got, want)
		}
	})
}
