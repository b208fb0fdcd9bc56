package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
)

// evictFlags are the flags of kvctl evict, as typed.
type evictFlags struct {
	namespace string
	tier      string
	keys      []string
	keysFile  string
	olderThan time.Duration
	bytes     string
	all       bool
	dryRun    bool
	demote    bool
	yes       bool
	list      int
}

// confirmListed is how many blocks the confirmation shows.
const confirmListed = 10

func (a *app) newEvictCommand() *cobra.Command {
	var f evictFlags
	cmd := &cobra.Command{
		Use:   "evict {--namespace NS | --tier TIER | --key NS/HASH | --keys-file FILE | --older-than D | --bytes SIZE | --all} [flags]",
		Short: "Remove blocks from a node, chosen by namespace, tier, key, age or bytes",
		Long: `evict removes the blocks that match every selector given, from every tier
or from --tier only. Blocks under a lease (pinned) are left alone.

Selectors (at least one, or --all):
  --namespace NS       blocks of one namespace: 16 hex digits, or redis for the
                       values stored through the Redis protocol
  --tier dram|ssd|s3   only the copies in this tier (s3: the object store)
  --key NS/HASH        these blocks (repeatable); --keys-file FILE reads one
                       NS/HASH a line (blank lines and # comments skipped)
  --older-than D       blocks not read or written for at least D (90s, 2h)
  --bytes SIZE         stop once SIZE is freed (1GiB, 500MB), taking the least
                       recently used matching blocks first
  --all                everything (with no other selector)

An eviction not limited to explicit keys is broad: kvctl first asks the node
what would go, shows the count, the bytes and the first blocks, and asks
"Evict N blocks (SIZE)? [y/N]" on the terminal. --yes skips the question; on
a stdin that is not a terminal, a broad eviction without --yes is refused
(exit status 2). --dry-run only reports what would go.

Output: a summary line and the first --list blocks (KEY TIER SIZE); with
-o json, a document with the counts and the listed blocks. A block held in
two tiers counts once per tier.`,
		Example: `  # See what evicting one namespace would free, without removing anything
  kvctl evict --namespace 9f86d081884c7d65 --dry-run

  # Free 5 GiB of the SSD tier, least recently used first, without asking
  kvctl evict --tier ssd --bytes 5GiB --yes

  # Drop blocks idle for two hours from a script
  kvctl evict --older-than 2h --yes -o json

  # Two blocks by key, and the keys in a file
  kvctl evict --key 9f86d081884c7d65/0123456789abcdef --key 9f86d081884c7d65/fedcba9876543210
  kvctl evict --keys-file stale-keys.txt

  # Everything the Redis protocol stored
  kvctl evict --namespace redis`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("evict takes selectors as flags, not arguments (got %q); see --help", args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return a.runEvict(cmd.Context(), f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.namespace, "namespace", "", "only blocks of this namespace: 16 hex digits, or redis")
	fl.StringVar(&f.tier, "tier", "", "only the copies in this tier: dram, ssd or s3")
	fl.StringArrayVar(&f.keys, "key", nil, "only this block, NS/HASH (repeatable)")
	fl.StringVar(&f.keysFile, "keys-file", "", "only the blocks listed in FILE, one NS/HASH a line")
	fl.DurationVar(&f.olderThan, "older-than", 0, "only blocks not accessed for this long, e.g. 30m")
	fl.StringVar(&f.bytes, "bytes", "", "stop once this much is freed, least recently used first, e.g. 1GiB")
	fl.BoolVar(&f.all, "all", false, "allow an eviction with no selector: everything")
	fl.BoolVar(&f.dryRun, "dry-run", false, "report what would be evicted; remove nothing")
	fl.BoolVar(&f.demote, "demote", false, "move the blocks from --tier to the tier below instead of removing them")
	fl.BoolVarP(&f.yes, "yes", "y", false, "evict without asking for confirmation")
	fl.IntVar(&f.list, "list", 20, "blocks listed in the output")
	return cmd
}

// evictPlan is a checked evict command line.
type evictPlan struct {
	sel   evictSelector
	broad bool // not limited to explicit keys: confirm first
}

// evictSelector is the selector of an EvictRequest.
type evictSelector struct {
	namespace *index.NamespaceID
	tier      string
	keys      []index.Key
	olderThan time.Duration
	bytes     int64
	all       bool
	demote    bool
}

func (s evictSelector) request(dryRun bool, listed int) *pb.EvictRequest {
	req := &pb.EvictRequest{Tier: s.tier, OlderThanMs: s.olderThan.Milliseconds(), Bytes: uint64(s.bytes),
		All: s.all, DryRun: dryRun, MaxListed: uint32(max(listed, 1)), Demote: s.demote}
	if s.namespace != nil {
		req.HasNamespace, req.Namespace = true, uint64(*s.namespace)
	}
	for _, k := range s.keys {
		req.Keys = append(req.Keys, pb.FromKey(k))
	}
	return req
}

// plan checks the flags and reports every problem at once as a usage
// error. The keys file is read later: a missing file is not a usage error.
func (f evictFlags) plan() (evictPlan, error) {
	var p evictPlan
	var probs []string
	if f.namespace != "" {
		ns, err := index.ParseNamespaceID(f.namespace)
		if err != nil {
			probs = append(probs, "--namespace: "+err.Error())
		}
		p.sel.namespace = &ns
	}
	if f.tier != "" {
		if _, err := index.ParseTierKind(strings.ToLower(f.tier)); err != nil {
			probs = append(probs, fmt.Sprintf("--tier: unknown tier %q (want dram, ssd or s3)", f.tier))
		}
		p.sel.tier = strings.ToLower(f.tier)
	}
	for _, s := range f.keys {
		k, err := index.ParseKey(s)
		if err != nil {
			probs = append(probs, "--key: "+err.Error())
		}
		p.sel.keys = append(p.sel.keys, k)
	}
	if f.olderThan < 0 {
		probs = append(probs, fmt.Sprintf("--older-than is %v, must be positive", f.olderThan))
	}
	p.sel.olderThan = f.olderThan
	if f.bytes != "" {
		n, err := parseSize(f.bytes)
		switch {
		case err != nil:
			probs = append(probs, "--bytes: "+err.Error())
		case n <= 0:
			probs = append(probs, fmt.Sprintf("--bytes is %s, must be positive", f.bytes))
		}
		p.sel.bytes = n
	}
	if f.list < 0 {
		probs = append(probs, fmt.Sprintf("--list is %d, must be ≥ 0", f.list))
	}
	p.sel.all = f.all
	p.sel.demote = f.demote
	if f.demote && f.tier == "" {
		probs = append(probs, "--demote needs --tier: the tier to move the blocks out of")
	}
	selects := f.namespace != "" || f.tier != "" || len(f.keys) > 0 || f.keysFile != "" || f.olderThan != 0 || f.bytes != ""
	if !selects && !f.all {
		probs = append(probs, "evict needs a selector: --namespace, --tier, --key, --keys-file, --older-than or --bytes (or --all for everything)")
	}
	if len(probs) > 0 {
		return evictPlan{}, usageErrorf("evict: %s", strings.Join(probs, "; "))
	}
	p.broad = len(f.keys) == 0 && f.keysFile == ""
	return p, nil
}

// evictOutput is evict's JSON document, part of kvctl's interface.
type evictOutput struct {
	DryRun bool          `json:"dry_run"`
	Blocks uint64        `json:"blocks"`
	Bytes  uint64        `json:"bytes"`
	Pinned uint64        `json:"pinned"` // matching blocks a lease kept
	Listed []evictedItem `json:"listed"`
}

type evictedItem struct {
	Key      string `json:"key"`
	Tier     string `json:"tier"`
	Size     uint32 `json:"size"`
	Checksum string `json:"checksum"`
}

func (a *app) runEvict(ctx context.Context, f evictFlags) error {
	p, err := f.plan()
	if err != nil {
		return err
	}
	if f.keysFile != "" {
		keys, err := readKeys(f.keysFile)
		if err != nil {
			return fmt.Errorf("evict: --keys-file: %w", err)
		}
		if len(keys) == 0 {
			return fmt.Errorf("evict: --keys-file %s lists no keys", f.keysFile)
		}
		p.sel.keys = append(p.sel.keys, keys...)
	}
	confirm := p.broad && !f.yes && !f.dryRun
	if confirm && !a.stdinTerminal() {
		return usageErrorf("evict: a broad eviction needs confirmation, and stdin is not a terminal: " +
			"add --yes to evict, or --dry-run to see what would go")
	}
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	if confirm {
		dry, err := c.Evict(ctx, p.sel.request(true, confirmListed))
		if err != nil {
			return fmt.Errorf("evict: dry run: %w", err)
		}
		if dry.Blocks == 0 {
			fmt.Fprintln(a.stdout, "Nothing matches: no blocks evicted.")
			return nil
		}
		if err := a.writeEvicted(a.stderr, true, dry, confirmListed); err != nil {
			return err
		}
		ok, err := a.ask(fmt.Sprintf("Evict %s (%s)? [y/N] ", count(dry.Blocks, "block"), formatBytes(dry.Bytes)))
		if err != nil {
			return fmt.Errorf("evict: reading the answer: %w", err)
		}
		if !ok {
			return errors.New("evict: not confirmed; nothing was evicted")
		}
	}
	resp, err := c.Evict(ctx, p.sel.request(f.dryRun, f.list))
	if err != nil {
		return fmt.Errorf("evict: %w", err)
	}
	if a.output == outputJSON {
		out := evictOutput{DryRun: f.dryRun, Blocks: resp.Blocks, Bytes: resp.Bytes, Pinned: resp.Pinned, Listed: []evictedItem{}}
		for _, e := range resp.Listed[:min(f.list, len(resp.Listed))] {
			m := e.GetMeta()
			out.Listed = append(out.Listed, evictedItem{Key: pb.ToKey(m.GetKey()).String(), Tier: e.Tier, Size: m.GetSize(),
				Checksum: checksumHex(m.GetChecksum())})
		}
		return writeJSON(a.stdout, out)
	}
	return a.writeEvicted(a.stdout, f.dryRun, resp, f.list)
}

// writeEvicted writes the summary line and up to listed blocks.
func (a *app) writeEvicted(w io.Writer, dry bool, r *pb.EvictResponse, listed int) error {
	if r.Pinned > 0 {
		fmt.Fprintf(w, "%s left alone: pinned by a lease.\n", count(r.Pinned, "matching block"))
	}
	switch {
	case r.Blocks == 0 && dry:
		_, err := fmt.Fprintln(w, "Nothing matches: no blocks would be evicted.")
		return err
	case r.Blocks == 0:
		_, err := fmt.Fprintln(w, "Nothing matched: no blocks evicted.")
		return err
	case dry:
		fmt.Fprintf(w, "Would evict %s (%s); dry run, nothing removed.\n", count(r.Blocks, "block"), formatBytes(r.Bytes))
	default:
		fmt.Fprintf(w, "Evicted %s (%s).\n", count(r.Blocks, "block"), formatBytes(r.Bytes))
	}
	shown := r.Listed[:min(listed, len(r.Listed))]
	if len(shown) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	rows := make([][]string, 0, len(shown))
	for _, e := range shown {
		m := e.GetMeta()
		rows = append(rows, []string{pb.ToKey(m.GetKey()).String(), e.Tier, formatBytes(m.GetSize())})
	}
	if err := writeTable(w, []string{"KEY", "TIER", "SIZE"}, rows); err != nil {
		return err
	}
	if more := r.Blocks - uint64(len(shown)); more > 0 {
		fmt.Fprintf(w, "… and %s more\n", thousands(more))
	}
	return nil
}

// ask writes question to stderr and reads a yes or no from stdin.
func (a *app) ask(question string) (bool, error) {
	fmt.Fprint(a.stderr, question)
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}
