package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/auth"
)

func hashSecretCmd(t *testing.T, input string, args ...string) (string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stdin")
	os.WriteFile(path, []byte(input), 0o600)
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out, errOut bytes.Buffer
	cmd := newHashSecretCommand(in, &out, &errOut)
	cmd.SetArgs(args)
	cmd.SetOut(&errOut)
	cmd.SetErr(&errOut)
	err = cmd.Execute()
	return strings.TrimSpace(out.String()), err
}

func TestHashSecretPrintsWhatTheUsersFileChecks(t *testing.T) {
	t.Parallel()
	h, err := hashSecretCmd(t, "s3cret\n", "--iterations", "1000")
	if err != nil || !strings.HasPrefix(h, "pbkdf2-sha256$1000$") || strings.Contains(h, "s3cret") {
		t.Fatalf("hash-secret = %q, %v", h, err)
	}
	tok := strings.Repeat("ab", 20)
	th, err := hashSecretCmd(t, tok+"\n", "--token")
	if err != nil || !strings.HasPrefix(th, "sha256$") {
		t.Fatalf("hash-secret --token = %q, %v", th, err)
	}
	u, err := auth.Parse(fmt.Appendf(nil, "[[user]]\nname = \"a\"\nsecret = %q\nroles = [\"read\"]\n[[user]]\nname = \"b\"\nsecret = %q\nroles = [\"read\"]\n", h, th))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.Password("a", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if id, err := u.Token(tok); err != nil || id.User != "b" {
		t.Fatalf("Token = %+v, %v", id, err)
	}
}

func TestHashSecretRefusesSecretsItCannotUse(t *testing.T) {
	t.Parallel()
	if _, err := hashSecretCmd(t, ""); err == nil || !strings.Contains(err.Error(), "no secret") {
		t.Errorf("empty input: %v", err)
	}
	if _, err := hashSecretCmd(t, "short\n", "--token"); err == nil || !strings.Contains(err.Error(), "too short") {
		t.Errorf("short token: %v", err)
	}
	if _, err := hashSecretCmd(t, "", "on-the-command-line"); err == nil || !strings.Contains(err.Error(), "never from the command line") {
		t.Errorf("an argument: %v", err)
	}
}
