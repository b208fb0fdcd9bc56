package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
)

func (a *app) newLookupCommand() *cobra.Command {
	var namespace, hashesFile string
	cmd := &cobra.Command{
		Use:   "lookup --namespace NS {HASH... | --hashes-file FILE}",
		Short: "Show how many leading blocks of a chain a node holds, and where",
		Long: `lookup asks the node at --addr for the longest prefix of a chain of block
hashes that it holds: the chain's blocks in order, each hash naming its
block and everything before it. It prints the prefix length (the lookup
stops at the first block held nowhere) and, for each tier, how many leading
blocks that tier holds on its own. A node answers from its replica of the
cluster's directory; when that is not current (no leader known, out of
touch with it, or catching up after a restart) lookup says so with a
"Stale:" line, as the answer may list blocks that are gone and miss new
ones.

Hashes are 16 hex digits, as kvctl prints them, or 0x and up to 16 (0xab);
--hashes-file reads one a line (blank lines and # comments skipped) after
those on the command line. NS is the chain's namespace, written the same
way, or redis. (The gRPC JSON mapping, as grpcurl speaks it, writes these
fixed64 numbers in decimal: printf '%u' 0xHASH turns one into the other.)`,
		Example: `  # A three-block chain
  kvctl lookup --namespace 9f86d081884c7d65 0123456789abcdef 1111111111111111 2222222222222222

  # A long chain from a file, as JSON
  kvctl lookup --namespace 9f86d081884c7d65 --hashes-file chain.txt -o json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runLookup(cmd.Context(), namespace, args, hashesFile)
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "the chain's namespace: 16 hex digits, or redis (required)")
	cmd.Flags().StringVar(&hashesFile, "hashes-file", "", "read the chain's hashes from FILE, one a line")
	return cmd
}

// lookupOutput is lookup's JSON document, part of kvctl's interface.
type lookupOutput struct {
	Namespace string       `json:"namespace"`
	Hashes    int          `json:"hashes"`
	Blocks    uint32       `json:"blocks"` // leading blocks held somewhere
	Tiers     []tierBlocks `json:"tiers"`
	// Freshness of the node's directory; absent from a node that does
	// not say.
	Freshness *freshness `json:"freshness,omitempty"`
}

// freshness is how current the directory that answered a lookup is.
type freshness struct {
	Current       bool   `json:"current"`
	LeaderID      uint32 `json:"leader_id"`
	LastContactMs int64  `json:"last_contact_ms"`
	AppliedIndex  uint64 `json:"applied_index"`
	CommitIndex   uint64 `json:"commit_index"`
	Reason        string `json:"reason,omitempty"`
}

type tierBlocks struct {
	Node   uint32 `json:"node_id"`
	Tier   string `json:"tier"`
	Blocks uint32 `json:"blocks"`
}

// readChain reads a namespace and a chain of hashes from --namespace, the
// arguments and --hashes-file, reporting every problem of the command line
// at once as a usage error.
func readChain(cmd, namespace string, args []string, hashesFile string) (index.NamespaceID, []index.Hash, error) {
	var probs []string
	var ns index.NamespaceID
	if namespace == "" {
		probs = append(probs, "--namespace is required")
	} else if v, err := index.ParseNamespaceID(namespace); err != nil {
		probs = append(probs, "--namespace: "+err.Error())
	} else {
		ns = v
	}
	chain := make([]index.Hash, 0, len(args))
	for _, s := range args {
		h, err := index.ParseHash(s)
		if err != nil {
			probs = append(probs, err.Error())
		}
		chain = append(chain, h)
	}
	if len(args) == 0 && hashesFile == "" {
		probs = append(probs, "no hashes: give them as arguments or with --hashes-file")
	}
	if len(probs) > 0 {
		return 0, nil, usageErrorf("%s: %s", cmd, strings.Join(probs, "; "))
	}
	if hashesFile != "" {
		more, err := readHashes(hashesFile)
		if err != nil {
			return 0, nil, fmt.Errorf("%s: --hashes-file: %w", cmd, err)
		}
		chain = append(chain, more...)
		if len(chain) == 0 {
			return 0, nil, fmt.Errorf("%s: --hashes-file %s lists no hashes", cmd, hashesFile)
		}
	}
	return ns, chain, nil
}

func (a *app) runLookup(ctx context.Context, namespace string, args []string, hashesFile string) error {
	ns, chain, err := readChain("lookup", namespace, args, hashesFile)
	if err != nil {
		return err
	}
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	r, err := c.Lookup(ctx, ns, chain)
	if err != nil {
		return fmt.Errorf("lookup: %w", err)
	}
	out := lookupOutput{Namespace: ns.String(), Hashes: len(chain), Blocks: r.Blocks, Tiers: []tierBlocks{}}
	for _, t := range r.Tiers {
		out.Tiers = append(out.Tiers, tierBlocks{Node: t.NodeId, Tier: t.Tier, Blocks: t.Blocks})
	}
	if f := r.Freshness; f != nil {
		out.Freshness = &freshness{Current: f.Current, LeaderID: f.LeaderId, LastContactMs: f.LastContactMs,
			AppliedIndex: f.AppliedIndex, CommitIndex: f.CommitIndex, Reason: f.Reason}
	}
	if a.output == outputJSON {
		return writeJSON(a.stdout, out)
	}
	fmt.Fprintf(a.stdout, "Prefix: %s of %s held.\n", thousands(out.Blocks), count(out.Hashes, "block"))
	if f := out.Freshness; f != nil && !f.Current {
		fmt.Fprintf(a.stdout, "Stale: this node's directory may be out of date (%s); ask another node.\n", f.Reason)
	}
	if len(out.Tiers) == 0 {
		return nil
	}
	fmt.Fprintln(a.stdout)
	rows := make([][]string, 0, len(out.Tiers))
	for _, t := range out.Tiers {
		rows = append(rows, []string{strconv.FormatUint(uint64(t.Node), 10), t.Tier, thousands(t.Blocks)})
	}
	return writeTable(a.stdout, []string{"NODE", "TIER", "LEADING_BLOCKS"}, rows)
}
