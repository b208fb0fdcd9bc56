// Package trace reads request traces in the Mooncake JSONL format: one JSON
// object a line,
//
//	{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}
//
// where timestamp is milliseconds since the start of the trace, the lengths
// count tokens, and each hash id names one block of the prompt together with
// its whole prefix (a chained hash), so a repeated id is a reusable prefix.
//
// What the reader checks, and what it leaves alone:
//
//   - Strict about JSON and types. Each non-blank line must hold exactly one
//     JSON object with all four fields; timestamp and the lengths must be
//     integers ≥ 0, hash_ids an array (possibly empty) of integers in
//     [0, 2^64). Anything else is an error naming the line and the problem,
//     and matching ErrMalformed. Unknown fields are ignored, so a trace that
//     carries more per request still reads. Blank lines are skipped.
//   - Tolerant of the block count. The Mooncake traces use 512-token blocks,
//     so len(hash_ids) == ceil(input_length/512) there, but traces recorded
//     with other block sizes exist, so the reader does not check the count;
//     a consumer that assumes a block size checks it (see Request.Blocks).
//   - File order is request order; timestamps need not increase.
//
// A Reader is not safe for concurrent use; the Requests it returns are the
// caller's.
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"unicode/utf8"
)

// ErrMalformed marks a trace that breaks the format; test with errors.Is.
var ErrMalformed = errors.New("trace: malformed")

// MaxLineBytes is the longest line a Reader accepts (16 MiB, a prompt of
// some two million blocks).
const MaxLineBytes = 16 << 20

// Request is one line of a trace.
type Request struct {
	Timestamp    int64    // milliseconds since the start of the trace
	InputLength  int64    // prompt tokens
	OutputLength int64    // generated tokens
	HashIDs      []uint64 // one per block of the prompt, first block first
}

// Blocks returns the number of blocks a prompt of r.InputLength tokens has
// at blockTokens tokens a block, counting a trailing partial block:
// ceil(InputLength / blockTokens). It is len(r.HashIDs) in a trace recorded
// at that block size. It panics if blockTokens < 1.
func (r Request) Blocks(blockTokens int) int64 {
	if blockTokens < 1 {
		panic("trace: blockTokens < 1")
	}
	return (r.InputLength + int64(blockTokens) - 1) / int64(blockTokens)
}

// LineError is the error for a line that breaks the format. It matches
// ErrMalformed.
type LineError struct {
	Path string // the file, when known (ReadFile)
	Line int    // 1-based
	Err  error  // what is wrong
}

// Error says "trace: line 3: …", or "trace: path:3: …" when the file is
// known, the form editors jump to.
func (e *LineError) Error() string {
	if e.Path != "" {
		return fmt.Sprintf("trace: %s:%d: %v", e.Path, e.Line, e.Err)
	}
	return fmt.Sprintf("trace: line %d: %v", e.Line, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

func (e *LineError) Is(target error) bool { return target == ErrMalformed }

// readError is a failure of the underlying reader.
type readError struct {
	line int // the last line read whole
	err  error
}

func (e *readError) Error() string {
	return fmt.Sprintf("trace: read after line %d: %v", e.line, e.err)
}

func (e *readError) Unwrap() error { return e.err }

// Reader reads requests one at a time.
type Reader struct {
	sc   *bufio.Scanner
	line int
	err  error // sticky: after an error, Next keeps returning it
}

// NewReader returns a Reader of the trace in r.
func NewReader(r io.Reader) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	return &Reader{sc: sc}
}

// Next returns the next request, io.EOF after the last one, or the error
// that stopped the reader (a *LineError for a bad line, else the read
// error); after an error every call returns it again.
func (r *Reader) Next() (Request, error) {
	if r.err != nil {
		return Request{}, r.err
	}
	for r.sc.Scan() {
		r.line++
		b := bytes.TrimSpace(r.sc.Bytes())
		if len(b) == 0 {
			continue
		}
		req, err := parseLine(b)
		if err != nil {
			r.err = &LineError{Line: r.line, Err: err}
			return Request{}, r.err
		}
		return req, nil
	}
	switch err := r.sc.Err(); {
	case errors.Is(err, bufio.ErrTooLong):
		r.err = &LineError{Line: r.line + 1, Err: fmt.Errorf("line longer than %d bytes", MaxLineBytes)}
	case err != nil:
		r.err = &readError{line: r.line, err: err}
	default:
		r.err = io.EOF
	}
	return Request{}, r.err
}

// Line returns the number of the line Next read last.
func (r *Reader) Line() int { return r.line }

// Read reads a whole trace.
func Read(r io.Reader) ([]Request, error) {
	tr := NewReader(r)
	var reqs []Request
	for {
		req, err := tr.Next()
		if err == io.EOF {
			return reqs, nil
		}
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, req)
	}
}

// ReadFile reads the trace at path.
func ReadFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	reqs, err := Read(bufio.NewReaderSize(f, 1<<20))
	var le *LineError
	var re *readError
	switch {
	case errors.As(err, &le):
		le.Path = path
		return nil, le
	case errors.As(err, &re):
		return nil, fmt.Errorf("trace: read %s after line %d: %w", path, re.line, re.err)
	case err != nil:
		return nil, err
	}
	return reqs, nil
}

// line is the JSON form of a Request; pointers tell a missing field from a
// zero.
type line struct {
	Timestamp    *int64    `json:"timestamp"`
	InputLength  *int64    `json:"input_length"`
	OutputLength *int64    `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
}

func firstRune(b []byte) string {
	r, _ := utf8.DecodeRune(b)
	return string(r)
}

func parseLine(b []byte) (Request, error) {
	if b[0] != '{' {
		return Request{}, fmt.Errorf("not a JSON object (starts with %q)", firstRune(b))
	}
	var l line
	if err := json.Unmarshal(b, &l); err != nil {
		return Request{}, describeJSONError(err)
	}
	var missing []string
	for _, f := range []struct {
		name    string
		present bool
	}{
		{"timestamp", l.Timestamp != nil},
		{"input_length", l.InputLength != nil},
		{"output_length", l.OutputLength != nil},
		{"hash_ids", l.HashIDs != nil},
	} {
		if !f.present {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return Request{}, fmt.Errorf("missing or null: %s", strings.Join(missing, ", "))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"timestamp", *l.Timestamp}, {"input_length", *l.InputLength}, {"output_length", *l.OutputLength}} {
		if f.v < 0 {
			return Request{}, fmt.Errorf("%s is %d, must be ≥ 0", f.name, f.v)
		}
	}
	return Request{
		Timestamp:    *l.Timestamp,
		InputLength:  *l.InputLength,
		OutputLength: *l.OutputLength,
		HashIDs:      *l.HashIDs,
	}, nil
}

// describeJSONError turns encoding/json's errors into the words a person
// fixing a trace needs: which field, what was there, what was wanted.
func describeJSONError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		want := "an integer"
		switch {
		case te.Type.Kind() == reflect.Slice:
			want = "an array of integers"
		case strings.HasPrefix(te.Field, "hash_ids"):
			want = "an integer in [0, 2^64)"
		}
		field := te.Field
		if field == "" {
			field = "line"
		}
		return fmt.Errorf("%s: got JSON %s, want %s", field, te.Value, want)
	case errors.As(err, &se):
		return fmt.Errorf("not valid JSON at byte %d: %v", se.Offset, err)
	}
	return fmt.Errorf("not valid JSON: %v", err)
}
