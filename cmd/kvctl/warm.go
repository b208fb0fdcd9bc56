package main

import (
	"context"
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
)

func (a *app) newWarmCommand() *cobra.Command {
	var namespace, hashesFile, tier string
	cmd := &cobra.Command{
		Use:   "warm --namespace NS {HASH... | --hashes-file FILE}",
		Short: "Copy a context's blocks up from slower tiers (the object store) ahead of need",
		Long: `warm asks the node at --addr to copy the given blocks into a fast tier
(--tier, default the fastest: dram) from wherever it holds them below — the
SSD, or the object store shared by the cluster — reading many at once, so
that the engine's request for that context finds it in memory. Blocks
already there are left alone; blocks held nowhere are counted as missing.

Hashes are 16 hex digits, or 0x and up to 16; --hashes-file reads one a
line. A progress bar is drawn on stderr when it is a terminal. Exit status 1 when a block failed.`,
		Example: `  # Warm a long document's blocks into DRAM
  kvctl warm --namespace 9f86d081884c7d65 --hashes-file doc.txt

  # Into the SSD only, as JSON
  kvctl warm --namespace 9f86d081884c7d65 --tier ssd 0123456789abcdef -o json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runWarm(cmd.Context(), namespace, args, hashesFile, tier)
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "the blocks' namespace: 16 hex digits, or redis (required)")
	cmd.Flags().StringVar(&hashesFile, "hashes-file", "", "read the hashes from FILE, one a line")
	cmd.Flags().StringVar(&tier, "tier", "", "tier to warm into: dram or ssd (default: the fastest)")
	return cmd
}

// warmOutput is warm's JSON document, part of kvctl's interface.
type warmOutput struct {
	Blocks  uint32  `json:"blocks"`
	Warmed  uint32  `json:"warmed"`
	Already uint32  `json:"already"`
	Missing uint32  `json:"missing"`
	Failed  uint32  `json:"failed"`
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"last_error,omitempty"`
}

func (a *app) runWarm(ctx context.Context, namespace string, args []string, hashesFile, tier string) error {
	if tier != "" {
		if _, err := index.ParseTierKind(tier); err != nil {
			return usageErrorf("warm: --tier: %v", err)
		}
	}
	ns, chain, err := readChain("warm", namespace, args, hashesFile)
	if err != nil {
		return err
	}
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	keys := make([]index.Key, len(chain))
	for i, h := range chain {
		keys[i] = index.Key{NS: ns, Hash: h}
	}
	var bar *progressbar.ProgressBar
	if a.interactive(a.stderr) {
		bar = progressbar.NewOptions(len(keys), progressbar.OptionSetWriter(a.stderr),
			progressbar.OptionSetDescription("warming"), progressbar.OptionShowCount(),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
	}
	start := time.Now()
	p, err := c.Warm(ctx, keys, tier, func(p *pb.WarmProgress) {
		if bar != nil {
			_ = bar.Set(int(p.Done))
		}
	})
	if bar != nil {
		_ = bar.Exit()
	}
	if err != nil {
		return fmt.Errorf("warm: %w", err)
	}
	out := warmOutput{Blocks: p.Total, Warmed: p.Warmed, Already: p.Already, Missing: p.Missing, Failed: p.Failed,
		Bytes: p.Bytes, Seconds: time.Since(start).Seconds(), Error: p.LastError}
	if a.output == outputJSON {
		err = writeJSON(a.stdout, out)
	} else {
		fmt.Fprintf(a.stdout, "Warmed %s (%s) in %.2fs; %s already there, %s missing, %s failed.\n",
			count(out.Warmed, "block"), formatBytes(out.Bytes), out.Seconds, thousands(out.Already), thousands(out.Missing), thousands(out.Failed))
		if out.Error != "" {
			fmt.Fprintf(a.stdout, "Last error: %s\n", out.Error)
		}
	}
	if err == nil && out.Failed > 0 {
		err = fmt.Errorf("warm: %s failed", count(out.Failed, "block"))
	}
	return err
}
