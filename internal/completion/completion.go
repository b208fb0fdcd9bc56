// Package completion writes the shell completion scripts of a cobra
// command tree: what `kvctl completion bash|zsh|fish` and `kvstrata
// completion …` print for a shell to load. The scripts ask the program
// itself for candidates (cobra's __complete), so they stay right as
// commands and flags change.
package completion

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// Shells are the shells Write has a script for.
var Shells = []string{"bash", "zsh", "fish"}

// ErrUnknownShell is Write's error for a shell not in Shells.
var ErrUnknownShell = errors.New("unknown shell")

// Write writes root's completion script for shell to w.
func Write(w io.Writer, root *cobra.Command, shell string) error {
	switch shell {
	case "bash":
		return root.GenBashCompletionV2(w, true)
	case "zsh":
		return root.GenZshCompletion(w)
	case "fish":
		return root.GenFishCompletion(w, true)
	}
	return fmt.Errorf("%w %q (want %s)", ErrUnknownShell, shell, strings.Join(Shells, ", "))
}

// Command returns the `completion SHELL` command of root's program;
// usage turns a wrong command line into the program's usage error.
func Command(program string, w io.Writer, usage func(error) error) *cobra.Command {
	return &cobra.Command{
		Use:   "completion {bash | zsh | fish}",
		Short: "Print the shell completion script",
		Long: `completion prints the script that lets SHELL complete ` + program + `'s commands,
flags and their values. Load it for this shell session, or install it:

  bash:  source <(` + program + ` completion bash)
         ` + program + ` completion bash > /etc/bash_completion.d/` + program + `
  zsh:   source <(` + program + ` completion zsh)
         ` + program + ` completion zsh > "${fpath[1]}/_` + program + `"
  fish:  ` + program + ` completion fish | source
         ` + program + ` completion fish > ~/.config/fish/completions/` + program + `.fish

Bash needs the bash-completion package.`,
		ValidArgs: Shells,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usage(fmt.Errorf("completion takes one shell (%s), got %d arguments", strings.Join(Shells, ", "), len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			err := Write(w, cmd.Root(), args[0])
			if errors.Is(err, ErrUnknownShell) {
				return usage(fmt.Errorf("completion: %w", err))
			}
			return err
		},
	}
}
