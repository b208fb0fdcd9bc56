package kvevents

import (
	"bytes"
	"errors"
	"testing"
)

func TestFrames(t *testing.T) {
	f := Frames("kv@worker-0", 258, []byte{0x90})
	if len(f) != 3 || string(f[0]) != "kv@worker-0" || !bytes.Equal(f[1], []byte{0, 0, 0, 0, 0, 0, 1, 2}) || !bytes.Equal(f[2], []byte{0x90}) {
		t.Fatalf("Frames = %x", f)
	}
	topic, seq, payload, err := ParseFrames(f)
	if err != nil || topic != "kv@worker-0" || seq != 258 || !bytes.Equal(payload, []byte{0x90}) {
		t.Fatalf("ParseFrames = %q, %d, %x, %v", topic, seq, payload, err)
	}
	for name, bad := range map[string][][]byte{
		"two frames":       {nil, SeqBytes(1)},
		"short sequence":   {nil, {1, 2, 3}, nil},
		"long sequence":    {nil, make([]byte, 9), nil},
		"four frames":      {nil, SeqBytes(1), nil, nil},
		"no frames at all": nil,
	} {
		if _, _, _, err := ParseFrames(bad); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: ParseFrames err = %v, want ErrFrame", name, err)
		}
	}
}

func TestReplayFrames(t *testing.T) {
	if !bytes.Equal(SeqBytes(EndSeq), bytes.Repeat([]byte{0xff}, 8)) {
		t.Fatalf("EndSeq = %x, want -1 as 8 bytes", SeqBytes(EndSeq))
	}
	req := ReplayRequest(7)
	// A ROUTER receives the identity and the empty delimiter before it.
	id, start, err := ParseReplayRequest(append([][]byte{[]byte("client"), {}}, req...))
	if err != nil || string(id) != "client" || start != 7 {
		t.Fatalf("ParseReplayRequest = %q, %d, %v", id, start, err)
	}
	if _, _, err := ParseReplayRequest(req); !errors.Is(err, ErrFrame) {
		t.Errorf("request without identity: err = %v", err)
	}
	if _, _, err := ParseReplayRequest([][]byte{[]byte("c"), {0}, SeqBytes(1)}); !errors.Is(err, ErrFrame) {
		t.Errorf("request with a non-empty delimiter: err = %v", err)
	}
	seq, p, end, err := ParseReplayReply(ReplayReply(9, []byte{1}))
	if err != nil || seq != 9 || !bytes.Equal(p, []byte{1}) || end {
		t.Fatalf("reply = %d, %x, %v, %v", seq, p, end, err)
	}
	last := ReplayReply(EndSeq, nil)
	if len(last[1]) != 0 || last[1] == nil {
		t.Fatalf("end reply payload = %#v, want an empty frame", last[1])
	}
	if seq, _, end, err := ParseReplayReply(last); err != nil || !end || seq != EndSeq {
		t.Fatalf("end reply = %d, %v, %v", seq, end, err)
	}
	if _, _, _, err := ParseReplayReply([][]byte{SeqBytes(1)}); !errors.Is(err, ErrFrame) {
		t.Errorf("one-frame reply: err = %v", err)
	}
}
