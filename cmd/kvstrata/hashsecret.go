package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvstrata/kvstrata/auth"
)

// newHashSecretCommand is `kvstrata hash-secret`: the secret, read from a
// prompt or standard input (never the command line, where ps and the
// shell's history would show it), becomes the string a users file keeps.
func newHashSecretCommand(stdin *os.File, stdout, stderr io.Writer) *cobra.Command {
	var token bool
	var iterations int
	cmd := &cobra.Command{
		Use:   "hash-secret",
		Short: "Hash a password or token for the users file (auth.users-file)",
		Long: `hash-secret reads a secret and prints the string to put in a users file's
secret = "…": pbkdf2-sha256$<iterations>$<salt>$<hash> for a password, or, with
--token, sha256$<hex> for a random token of at least 32 characters (which a
bearer token alone, without a user name, can then be matched to).

At a terminal it asks for the secret twice, without echo; otherwise it reads
the first line of standard input:

  openssl rand -hex 32 | tee svc.token | kvstrata hash-secret --token`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{errors.New("hash-secret reads the secret from standard input, never from the command line")}
			}
			return nil
		},
		RunE: func(*cobra.Command, []string) error {
			secret, err := readSecret(stdin, stderr)
			if err != nil {
				return err
			}
			var h string
			if token {
				h, err = auth.HashToken(secret)
			} else {
				h, err = auth.HashSecret(secret, iterations)
			}
			if err != nil {
				return usageError{err}
			}
			fmt.Fprintln(stdout, h)
			return nil
		},
	}
	cmd.Flags().BoolVar(&token, "token", false, "hash a random token (sha256$), not a password")
	cmd.Flags().IntVar(&iterations, "iterations", auth.DefaultIterations, "PBKDF2 rounds for a password")
	return cmd
}

// readSecret asks for the secret twice at a terminal, else reads a line.
func readSecret(in *os.File, prompt io.Writer) (string, error) {
	if in != nil && term.IsTerminal(int(in.Fd())) {
		fmt.Fprint(prompt, "Secret: ")
		a, err := term.ReadPassword(int(in.Fd()))
		fmt.Fprintln(prompt)
		if err != nil {
			return "", err
		}
		fmt.Fprint(prompt, "Again: ")
		b, err := term.ReadPassword(int(in.Fd()))
		fmt.Fprintln(prompt)
		if err != nil {
			return "", err
		}
		if string(a) != string(b) {
			return "", usageError{errors.New("the two secrets differ")}
		}
		return string(a), nil
	}
	var r io.Reader = os.Stdin
	if in != nil {
		r = in
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", usageError{errors.New("no secret on standard input")}
	}
	return line, nil
}
