package resp_test

import (
	"fmt"
	"sync"
	"testing"
)

func TestReadModifyWriteCommands(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	c := dial(t, addr)
	run(t, c, []step{
		{cmd("INCR n"), ":1"},
		{cmd("INCRBY n 41"), ":42"},
		{cmd("DECR n"), ":41"},
		{cmd("DECRBY n -9"), ":50"},
		{cmd("GET n"), `"50"`},
		{cmd("INCRBY n x"), "-ERR value is not an integer or out of range"},
		{cmd("SET big 9223372036854775807"), "+OK"},
		{cmd("INCR big"), "-ERR increment or decrement would overflow"},
		{cmd("DECRBY n -9223372036854775808"), "-ERR value is not an integer or out of range"},
		{cmd("SET s 012"), "+OK"},
		{cmd("INCR s"), "-ERR value is not an integer or out of range"},
		{cmd("GET s"), `"012"`}, // a refused update changes nothing
		{cmd("SET t 5 EX 100"), "+OK"},
		{cmd("INCR t"), ":6"},
		{cmd("TTL t"), `/^:(99|100)$/`}, // INCR keeps the deadline
		{cmd("APPEND t ab"), ":3"},
		{cmd("TTL t"), `/^:(99|100)$/`},
		{cmd("APPEND new xy"), ":2"},
		{cmd("GETSET t v2"), `"6ab"`},
		{cmd("TTL t"), ":-1"}, // GETSET removes it, as SET
		{cmd("GETSET none v"), "nil"},
		{cmd("GETDEL t"), `"v2"`},
		{cmd("GETDEL t"), "nil"},
		{cmd("EXISTS t"), ":0"},
		{cmd("MULTI"), "+OK"},
		{cmd("INCR n"), "/^-ERR .*/"},
		{cmd("EXEC"), "/^-EXECABORT/"},
		{cmd("GET n"), `"50"`},
	})
}

// INCR is atomic: concurrent increments through many connections all count.
func TestConcurrentIncrementsAllCount(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	var wg sync.WaitGroup
	for range 8 {
		c := dial(t, addr)
		wg.Go(func() {
			for range 50 {
				c.do("INCR", "counter")
			}
		})
	}
	wg.Wait()
	if got := dial(t, addr).do("GET", "counter"); got != fmt.Sprintf("%q", "400") {
		t.Fatalf("GET counter after 8 x 50 INCR = %s, want \"400\"", got)
	}
}
