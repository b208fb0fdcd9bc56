package trace

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

const twoRequests = `{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}
{"timestamp": 27, "input_length": 1000, "output_length": 3, "hash_ids": [0, 14]}
`

func TestReadParsesEveryField(t *testing.T) {
	got, err := Read(strings.NewReader(twoRequests))
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{Timestamp: 0, InputLength: 6758, OutputLength: 500, HashIDs: []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}},
		{Timestamp: 27, InputLength: 1000, OutputLength: 3, HashIDs: []uint64{0, 14}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Read = %+v\nwant %+v", got, want)
	}
}

func TestReadAcceptsWhatTheFormatAllows(t *testing.T) {
	for name, in := range map[string]string{
		"blank lines and CRLF":    "\n" + strings.ReplaceAll(twoRequests, "\n", "\r\n\n  \n"),
		"no final newline":        strings.TrimSuffix(twoRequests, "\n"),
		"unknown fields":          strings.ReplaceAll(twoRequests, `"timestamp"`, `"session": "x", "timestamp"`),
		"fields in another order": strings.ReplaceAll(twoRequests, `{"timestamp": 0, `, `{"input_length": 6758, "timestamp": 0, "x": [1, {}], `),
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Read(strings.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || got[1].InputLength != 1000 || len(got[0].HashIDs) != 14 {
				t.Fatalf("Read = %+v", got)
			}
		})
	}
}

func TestReadToleratesABlockCountOfAnotherBlockSize(t *testing.T) {
	// 1000 tokens are 2 blocks of 512 but 4 of 256: both traces read.
	got, err := Read(strings.NewReader(`{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [7, 8, 9, 10]}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := got[0].Blocks(256); n != 4 {
		t.Fatalf("Blocks(256) = %d, want 4", n)
	}
	if n := got[0].Blocks(512); n != 2 {
		t.Fatalf("Blocks(512) = %d, want 2", n)
	}
}

func TestReadAcceptsAnEmptyTraceAndAnEmptyPrompt(t *testing.T) {
	got, err := Read(strings.NewReader(""))
	if err != nil || len(got) != 0 {
		t.Fatalf("Read of nothing = %v, %v; want no requests", got, err)
	}
	got, err = Read(strings.NewReader(`{"timestamp": 5, "input_length": 0, "output_length": 0, "hash_ids": []}`))
	if err != nil || len(got) != 1 || got[0].HashIDs == nil {
		t.Fatalf("Read of an empty prompt = %+v, %v", got, err)
	}
}

func TestReadNamesTheLineAndTheProblem(t *testing.T) {
	ok := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}` + "\n"
	for _, c := range []struct{ line, want string }{
		{`not json`, `not a JSON object`},
		{`[1, 2]`, `not a JSON object`},
		{`{"timestamp": 0, "input_length": 10`, `not valid JSON`},
		{ok[:len(ok)-1] + ` {}`, `not valid JSON`},
		{`{"timestamp": 0, "input_length": -3, "output_length": 1, "hash_ids": [1]}`, `input_length is -3, must be ≥ 0`},
		{`{"timestamp": -1, "input_length": 3, "output_length": 1, "hash_ids": [1]}`, `timestamp is -1`},
		{`{"timestamp": 0, "input_length": 3, "output_length": -9, "hash_ids": [1]}`, `output_length is -9`},
		{`{"timestamp": 0, "input_length": 2.5, "output_length": 1, "hash_ids": [1]}`, `input_length: got JSON number 2.5, want an integer`},
		{`{"timestamp": "0", "input_length": 3, "output_length": 1, "hash_ids": [1]}`, `timestamp: got JSON string`},
		{`{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1, -2]}`, `hash_ids: got JSON number -2, want an integer in [0, 2^64)`},
		{`{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": {"a": 1}}`, `hash_ids: got JSON object, want an array of integers`},
		{`{"timestamp": 0, "input_length": 3, "output_length": 1}`, `missing or null: hash_ids`},
		{`{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": null}`, `missing or null: hash_ids`},
		{`{}`, `missing or null: timestamp, input_length, output_length, hash_ids`},
	} {
		_, err := Read(strings.NewReader(ok + "\n" + c.line + "\n" + ok))
		if err == nil {
			t.Errorf("%s: no error", c.line)
			continue
		}
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v does not match ErrMalformed", c.line, err)
		}
		var le *LineError
		if !errors.As(err, &le) || le.Line != 3 {
			t.Errorf("%s: error %v does not name line 3", c.line, err)
		}
		if !strings.Contains(err.Error(), "line 3: "+c.want) {
			t.Errorf("%s: error %q, want it to say %q", c.line, err, c.want)
		}
	}
}

func TestReaderStreamsAndStopsAtTheFirstError(t *testing.T) {
	r := NewReader(iotest.OneByteReader(strings.NewReader(twoRequests + "oops\n" + twoRequests)))
	for i := range 2 {
		if _, err := r.Next(); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	_, err := r.Next()
	if !errors.Is(err, ErrMalformed) || r.Line() != 3 {
		t.Fatalf("third Next = %v at line %d, want a malformed line 3", err, r.Line())
	}
	if _, again := r.Next(); again != err {
		t.Fatalf("Next after an error = %v, want the same error %v", again, err)
	}
}

func TestReaderReportsReadErrorsAndEOF(t *testing.T) {
	boom := errors.New("disk on fire")
	_, err := Read(io.MultiReader(strings.NewReader(twoRequests), iotest.ErrReader(boom)))
	if !errors.Is(err, boom) || errors.Is(err, ErrMalformed) {
		t.Fatalf("Read over a failing reader = %v, want the read error, not a malformed trace", err)
	}
	r := NewReader(strings.NewReader(""))
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("Next on an empty trace = %v, want io.EOF", err)
	}
}

func TestReadRejectsOverlongLines(t *testing.T) {
	long := `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [` + strings.Repeat("1, ", MaxLineBytes/3) + `1]}`
	_, err := Read(strings.NewReader(twoRequests + long))
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "line 3: line longer than") {
		t.Fatalf("Read of an overlong line = %v", err)
	}
}

func TestReadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(path, []byte(twoRequests+"{\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ReadFile(path)
	if !errors.Is(err, ErrMalformed) || !strings.HasPrefix(err.Error(), "trace: "+path+":3: not valid JSON") {
		t.Fatalf("ReadFile of a bad trace = %v, want the path and the line", err)
	}
	_, err = ReadFile(filepath.Join(t.TempDir(), "missing.jsonl"))
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing.jsonl") {
		t.Fatalf("ReadFile of a missing file = %v, want a not-exist error naming the file", err)
	}
}

func TestReadTheMooncakeTraces(t *testing.T) {
	for name, want := range map[string]struct{ rows, refs int }{
		"conversation_trace.jsonl": {12031, 288500},
		"synthetic_trace.jsonl":    {3993, 121877},
	} {
		reqs, err := ReadFile(filepath.Join("..", "testdata", "traces", name))
		if err != nil {
			t.Fatal(err)
		}
		refs, mismatched := 0, 0
		for _, r := range reqs {
			refs += len(r.HashIDs)
			if r.Blocks(512) != int64(len(r.HashIDs)) {
				mismatched++
			}
		}
		if len(reqs) != want.rows || refs != want.refs || mismatched != 0 {
			t.Errorf("%s: %d rows, %d block references, %d with a block count other than ceil(input/512); want %d, %d, 0",
				name, len(reqs), refs, mismatched, want.rows, want.refs)
		}
	}
}

func FuzzRead(f *testing.F) {
	f.Add([]byte(twoRequests))
	f.Add([]byte(`{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": [1]}`))
	f.Add([]byte(`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, 2.5]}` + "\n\n"))
	f.Add([]byte(`{"timestamp": 1e3, "hash_ids": null}`))
	f.Add([]byte("\xff\xfe{\n[]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := Read(strings.NewReader(string(data)))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v from an in-memory reader is not ErrMalformed", err)
			}
			return
		}
		for i, r := range reqs {
			if r.Timestamp < 0 || r.InputLength < 0 || r.OutputLength < 0 || r.HashIDs == nil {
				t.Fatalf("request %d read as %+v", i, r)
			}
		}
	})
}
