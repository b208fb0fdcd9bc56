package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// run executes kvctl in-process, as a person would run it from a shell
// with no terminal and an empty environment, and returns its exit status
// and what it wrote.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runWith(t, session{}, args...)
}

// session is what surrounds a run: stdin, whether stdin and the outputs
// are terminals, the environment.
type session struct {
	stdin       string
	terminal    bool // stdin is a terminal a person types at
	outTerminal bool // stdout and stderr are a terminal a person watches
	env         map[string]string
}

func runWith(t *testing.T, s session, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	a := &app{output: outputTable, stdin: strings.NewReader(s.stdin), stdout: &out, stderr: &errOut,
		interactive:   func(io.Writer) bool { return s.outTerminal },
		stdinTerminal: func() bool { return s.terminal },
		getenv:        func(k string) string { return s.env[k] }}
	code = a.execute(context.Background(), args)
	return code, out.String(), errOut.String()
}

// wantFailure checks that a run failed with the given status and one clear
// message, and no stack trace or usage dump.
func wantFailure(t *testing.T, code int, stderr string, wantCode int, wantMsg string) {
	t.Helper()
	if code != wantCode {
		t.Errorf("exit status %d, want %d (stderr %q)", code, wantCode, stderr)
	}
	first, _, _ := strings.Cut(stderr, "\n")
	if !strings.HasPrefix(first, "kvctl: ") || !strings.Contains(first, wantMsg) {
		t.Errorf("first line of stderr %q, want a kvctl: line saying %q", first, wantMsg)
	}
	for _, noise := range []string{"goroutine ", "panic", "Flags:"} {
		if strings.Contains(stderr, noise) {
			t.Errorf("stderr holds %q:\n%s", noise, stderr)
		}
	}
}

func TestKvctlAloneShowsHelp(t *testing.T) {
	code, out, _ := run(t)
	if code != exitOK || !strings.Contains(out, "Available Commands:") || !strings.Contains(out, "sim ") {
		t.Fatalf("kvctl: status %d, output:\n%s", code, out)
	}
	if !strings.Contains(out, "Exit status:") || !strings.Contains(out, "-o, --output") {
		t.Fatalf("kvctl help does not document the exit statuses and --output:\n%s", out)
	}
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	code, _, stderr := run(t, "simulate", "x")
	wantFailure(t, code, stderr, exitUsage, `unknown command "simulate"`)
	if !strings.Contains(stderr, "Run 'kvctl --help' for usage.") {
		t.Errorf("stderr does not point at --help: %q", stderr)
	}
}

func TestUnknownFlagIsAUsageError(t *testing.T) {
	code, _, stderr := run(t, "sim", "--bogus", "t.jsonl")
	wantFailure(t, code, stderr, exitUsage, "unknown flag: --bogus")
	if !strings.Contains(stderr, "Run 'kvctl sim --help' for usage.") {
		t.Errorf("stderr does not point at sim --help: %q", stderr)
	}
}

func TestOutputFormatIsChecked(t *testing.T) {
	code, _, stderr := run(t, "-o", "yaml", "sim", "t.jsonl")
	wantFailure(t, code, stderr, exitUsage, `invalid argument "yaml" for "-o, --output" flag: want table or json`)

	var f outputFormat
	if err := f.Set("JSON"); err != nil || f != outputJSON {
		t.Fatalf("Set(JSON) = %v, format %q", err, f)
	}
}
