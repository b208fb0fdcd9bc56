package resp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// parserConfig has small limits, so tests reach them cheaply: arguments
// over 2 KiB take the slab path.
func parserConfig() *Config {
	cfg := &Config{ReadBufferSize: 4096, MaxBulkLen: 8192, MaxArgs: 16, MaxCommandBytes: 12000}
	cfg.EnsureDefaults()
	return cfg
}

// readAll reads commands from src until an error and returns them with
// the error (io.EOF at a clean end). It checks after every command that
// the reader holds no more memory than its limits allow.
func readAll(t testing.TB, src io.Reader, cfg *Config) ([][]string, error) {
	r := newReader(src, cfg)
	var cmds [][]string
	for {
		args, err := r.next()
		if ref := (*refusedError)(nil); errors.As(err, &ref) {
			cmds = append(cmds, []string{"refused: " + ref.msg})
			continue
		}
		if err != nil {
			return cmds, err
		}
		var cmd []string
		var total int64
		for _, a := range args {
			cmd = append(cmd, string(a))
			total += int64(len(a))
			if int64(len(a)) > cfg.MaxBulkLen {
				t.Fatalf("argument of %d bytes, over MaxBulkLen %d", len(a), cfg.MaxBulkLen)
			}
		}
		if len(args) > cfg.MaxArgs || total > max(cfg.MaxCommandBytes, int64(cfg.ReadBufferSize)) {
			t.Fatalf("command of %d args and %d bytes, over the limits", len(args), total)
		}
		if fp, limit := r.footprint(), 4*cfg.MaxCommandBytes+int64(cfg.MaxArgs)*200+2*int64(cfg.ReadBufferSize); fp > limit {
			t.Fatalf("reader holds %d bytes, over %d", fp, limit)
		}
		cmds = append(cmds, cmd)
	}
}

// footprint is the memory the reader holds, in bytes.
func (r *reader) footprint() int64 {
	n := int64(cap(r.buf) + cap(r.arena) + 24*cap(r.args) + 32*cap(r.refs))
	for _, s := range r.slabs {
		n += int64(cap(*s))
	}
	return n
}

var bigValue = strings.Repeat("0123456789abcdef", 300) // 4800 bytes: over the 2 KiB small-argument size

func bulkArray(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

var validInputs = []struct {
	name string
	in   string
	want [][]string
}{
	{"array of bulk strings", "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", [][]string{{"GET", "k"}}},
	{"pipelined commands", bulkArray("SET", "k", "v") + bulkArray("GET", "k") + bulkArray("PING"),
		[][]string{{"SET", "k", "v"}, {"GET", "k"}, {"PING"}}},
	{"empty bulk string", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n", [][]string{{"SET", "k", ""}}},
	{"binary value holding CRLF", bulkArray("SET", "k", "a\r\nb\x00"), [][]string{{"SET", "k", "a\r\nb\x00"}}},
	{"empty and null arrays are skipped", "*0\r\n*-1\r\n" + bulkArray("PING"), [][]string{{"PING"}}},
	{"value over the small-argument size", bulkArray("SET", "k", bigValue) + bulkArray("GET", "k"),
		[][]string{{"SET", "k", bigValue}, {"GET", "k"}}},
	{"inline command", "PING\r\n", [][]string{{"PING"}}},
	{"inline command ended by LF only", "GET k\n", [][]string{{"GET", "k"}}},
	{"inline with runs of spaces and tabs", "  SET \t k   v \r\n", [][]string{{"SET", "k", "v"}}},
	{"inline with quotes", `SET "a b" 'c d'` + "\r\n", [][]string{{"SET", "a b", "c d"}}},
	{"inline with escapes", `SET "\x41\n\t\"\\" 'it\'s'` + "\r\n", [][]string{{"SET", "A\n\t\"\\", "it's"}}},
	{"inline with empty quotes", `SET k ""` + "\r\n", [][]string{{"SET", "k", ""}}},
	{"empty inline lines are skipped", "\r\n\n   \r\nPING\r\n", [][]string{{"PING"}}},
	{"inline and arrays mixed", "PING\r\n" + bulkArray("ECHO", "x") + "ECHO y\r\n",
		[][]string{{"PING"}, {"ECHO", "x"}, {"ECHO", "y"}}},
}

func TestReaderParsesCommands(t *testing.T) {
	for _, tc := range validInputs {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(t, strings.NewReader(tc.in), parserConfig())
			if err != io.EOF {
				t.Fatalf("ended with %v, want io.EOF", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("read %q\nwant %q", got, tc.want)
			}
		})
	}
}

// Input arrives in pieces of any size: a command split anywhere, or read
// one byte at a time, reads the same.
func TestReaderParsesInputSplitAtEveryByte(t *testing.T) {
	for _, tc := range validInputs {
		t.Run(tc.name, func(t *testing.T) {
			for i := range len(tc.in) + 1 {
				src := io.MultiReader(strings.NewReader(tc.in[:i]), strings.NewReader(tc.in[i:]))
				got, err := readAll(t, src, parserConfig())
				if err != io.EOF || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("split at %d: read %q, %v; want %q, EOF", i, got, err, tc.want)
				}
			}
			got, err := readAll(t, iotest.OneByteReader(strings.NewReader(tc.in)), parserConfig())
			if err != io.EOF || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("one byte at a time: read %q, %v; want %q, EOF", got, err, tc.want)
			}
		})
	}
}

func TestReaderRejectsMalformedInput(t *testing.T) {
	cases := []struct {
		name, in, want string // want: the ProtocolError's message
	}{
		{"negative bulk length", "*1\r\n$-1\r\n", "invalid bulk length"},
		{"bulk length not a number", "*1\r\n$abc\r\n", "invalid bulk length"},
		{"bulk length with a plus sign", "*1\r\n$+1\r\na\r\n", "invalid bulk length"},
		{"more arguments than MaxArgs", "*17\r\n", "invalid multibulk length"},
		{"argument count not a number", "*x\r\n", "invalid multibulk length"},
		{"argument count with a leading zero", "*01\r\n", "invalid multibulk length"},
		{"argument count over int64", "*99999999999999999999\r\n", "invalid multibulk length"},
		{"array element not a bulk string", "*1\r\n:1\r\n", "expected '$', got ':'"},
		{"array element empty line", "*1\r\n\r\n", `expected '$', got '\r'`},
		{"bulk string longer than declared", "*1\r\n$1\r\nab\r\n", `expected '\r\n' after bulk string, got "b\r"`},
		{"long bulk string not ended by CRLF", "*1\r\n$4800\r\n" + bigValue + "xx", `expected '\r\n' after bulk string, got "xx"`},
		{"header ended by LF only", "*1\n$4\r\nPING\r\n", `expected '\r\n' at the end of "*1"`},
		{"argument count line too long", "*" + strings.Repeat("1", 100), "too big mbulk count string"},
		{"bulk length line too long", "*1\r\n$" + strings.Repeat("1", 100), "too big bulk count string"},
		{"inline line longer than the read buffer", strings.Repeat("a", 5000), "too big inline request"},
		{"inline with more words than MaxArgs", strings.Repeat("a ", 17) + "\r\n", "invalid multibulk length"},
		{"unbalanced double quote", `SET "a` + "\r\n", "unbalanced quotes in request"},
		{"unbalanced single quote", `SET 'a` + "\r\n", "unbalanced quotes in request"},
		{"closing quote not followed by a space", `SET "a"b` + "\r\n", "unbalanced quotes in request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readAll(t, strings.NewReader(tc.in), parserConfig())
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Msg != tc.want {
				t.Fatalf("got %v, want protocol error %q", err, tc.want)
			}
		})
	}
}

// A command with an argument over MaxBulkLen, or over MaxCommandBytes in
// all, is read to its end and dropped: the reader says why and reads the
// next command, holding no memory for what it dropped.
func TestReaderRefusesOversizedCommandsAndStaysInStep(t *testing.T) {
	cfg := parserConfig()
	big := strings.Repeat("v", 9000)
	in := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$9000\r\n" + big + "\r\n" +
		"*1\r\n$4\r\nPING\r\n" +
		"*3\r\n$4\r\nMSET\r\n$8000\r\n" + big[:8000] + "\r\n$8000\r\n" + big[:8000] + "\r\n" +
		"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
	want := [][]string{
		{"refused: ERR argument of 9000 bytes is over the 8.0 KiB limit on one value"},
		{"PING"},
		{"refused: ERR command of more than 16004 bytes is over the 11.7 KiB limit on one command"},
		{"GET", "k"},
	}
	for name, src := range map[string]io.Reader{"whole": strings.NewReader(in), "one byte at a time": iotest.OneByteReader(strings.NewReader(in))} {
		got, err := readAll(t, src, cfg)
		if err != io.EOF || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: read %q, %v; want %q, EOF", name, got, err, want)
		}
	}
	cfg.MaxBulkLenSetting = "limits.max-value-size"
	r := newReader(strings.NewReader(in), cfg)
	var ref *refusedError
	if _, err := r.next(); !errors.As(err, &ref) || !strings.HasSuffix(ref.msg, "(limits.max-value-size)") {
		t.Fatalf("next: %v, want a refusal naming the setting", err)
	}
	if r.footprint() > 2*int64(cfg.ReadBufferSize) {
		t.Fatalf("reader holds %d bytes after dropping a 9000-byte argument", r.footprint())
	}
	// A refused argument must still end in CRLF: anything else is not RESP.
	if _, err := readAll(t, strings.NewReader("*1\r\n$9000\r\n"+big+"xx"), cfg); !errors.As(err, new(*ProtocolError)) {
		t.Fatalf("dropped argument not ended by CRLF: %v, want a protocol error", err)
	}
}

func TestReaderReportsTruncatedCommands(t *testing.T) {
	for _, in := range []string{"*2\r\n$3\r\nGET\r\n", "*1\r\n$4\r\nPI", "*1\r\n$4800\r\n" + bigValue[:100], "PING"} {
		_, err := readAll(t, strings.NewReader(in), parserConfig())
		if err != io.ErrUnexpectedEOF {
			t.Errorf("%.20q…: got %v, want io.ErrUnexpectedEOF", in, err)
		}
	}
}

// The reader must not trust declared lengths: a header announcing a huge
// array or bulk string allocates nothing before the bytes arrive, and
// nothing at all past the limits.
func TestReaderDoesNotAllocateForDeclaredLengths(t *testing.T) {
	cfg := parserConfig()
	cfg.MaxArgs = 1 << 20
	in := "*1048576\r\n$1\r\na\r\n"
	allocs := testing.AllocsPerRun(20, func() {
		r := newReader(strings.NewReader(in), cfg)
		r.next()
		if r.footprint() > 1<<20 {
			t.Fatalf("reader holds %d bytes after a 1M-argument header", r.footprint())
		}
	})
	if allocs > 10 {
		t.Fatalf("%v allocations for one header", allocs)
	}
}

// A long argument's memory follows its bytes as they arrive: a client
// that announces 16 MiB and sends 100 KiB makes the reader hold well under
// a megabyte.
func TestReaderGrowsLongArgumentsAsTheyArrive(t *testing.T) {
	cfg := &Config{MaxBulkLen: 16 << 20}
	cfg.EnsureDefaults()
	in := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$16777216\r\n" + strings.Repeat("v", 100<<10)
	stalled := errors.New("stalled")
	r := newReader(io.MultiReader(strings.NewReader(in), iotest.ErrReader(stalled)), cfg)
	if _, err := r.next(); !errors.Is(err, stalled) {
		t.Fatalf("next: %v, want the source's error", err)
	}
	if fp := r.footprint(); fp > 1<<20 {
		t.Fatalf("reader holds %d bytes after 100 KiB of a 16 MiB argument", fp)
	}
}

func TestParseInt(t *testing.T) {
	good := map[string]int64{"0": 0, "7": 7, "-1": -1, "1048576": 1 << 20,
		"9223372036854775807": 1<<63 - 1, "-9223372036854775808": -1 << 63}
	for in, want := range good {
		if got, ok := parseInt([]byte(in)); !ok || got != want {
			t.Errorf("parseInt(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "-", "+1", " 1", "1 ", "01", "-0", "1.5", "9223372036854775808", "-9223372036854775809", "12345678901234567890"} {
		if got, ok := parseInt([]byte(in)); ok {
			t.Errorf("parseInt(%q) = %d, want rejected", in, got)
		}
	}
}

// FuzzParse feeds arbitrary bytes to the reader whole and split in two:
// it must never panic, never hold memory beyond its limits (readAll
// checks), and read the same commands and error either way.
func FuzzParse(f *testing.F) {
	for _, tc := range validInputs {
		f.Add([]byte(tc.in), uint16(len(tc.in)/2))
	}
	f.Add([]byte("*1\r\n$-1\r\n"), uint16(3))
	f.Add([]byte("*2\r\n$200\r\n"+strings.Repeat("v", 200)+"\r\n$300\r\n"), uint16(5))
	f.Add([]byte(`SET "a\x4`), uint16(1))
	// Tiny limits keep interesting inputs short: arguments over 32 bytes
	// take the slab path, lines over 64 bytes are too long.
	cfg := &Config{ReadBufferSize: 64, MaxBulkLen: 256, MaxArgs: 8, MaxCommandBytes: 512}
	cfg.EnsureDefaults()
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		whole, errWhole := readAll(t, bytes.NewReader(data), cfg)
		i := int(split) % (len(data) + 1)
		parts, errParts := readAll(t, io.MultiReader(bytes.NewReader(data[:i]), bytes.NewReader(data[i:])), cfg)
		if !reflect.DeepEqual(whole, parts) || fmt.Sprint(errWhole) != fmt.Sprint(errParts) {
			t.Fatalf("whole: %q, %v\nsplit at %d: %q, %v", whole, errWhole, i, parts, errParts)
		}
	})
}

// A long argument that the read buffer took in part is read from the
// buffer first and then from the socket, whatever the buffer's size:
// the slab it goes into starts smaller than a large buffer, and a value
// of exactly the buffer's size arrives in one read with its header.
func TestReaderLongArgumentsWithAnyBufferSize(t *testing.T) {
	value := make([]byte, 1<<20)
	for i := range value {
		value[i] = byte(i * 7)
	}
	for _, size := range []int{4 << 10, 64 << 10, 256 << 10, 1 << 20} {
		cfg := &Config{ReadBufferSize: size, MaxBulkLen: 1 << 20, MaxArgs: 16, MaxCommandBytes: 2 << 20}
		cfg.EnsureDefaults()
		for _, n := range []int{size, 40 << 10, 300 << 10} {
			v := string(value[:n])
			in := bulkArray("SET", "k", v) + bulkArray("GET", "k")
			got, err := readAll(t, strings.NewReader(in), cfg)
			if err != io.EOF || len(got) != 2 || len(got[0]) != 3 || got[0][2] != v || !reflect.DeepEqual(got[1], []string{"GET", "k"}) {
				t.Fatalf("buffer %d, value %d: read %d commands, %v; want SET with the value whole, then GET", size, n, len(got), err)
			}
		}
	}
}
