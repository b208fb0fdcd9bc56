package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
)

// blockRow is one block put or got, for output; the JSON form is part of
// kvctl's interface.
type blockRow struct {
	Key      string `json:"key"`
	Found    bool   `json:"found"`
	Size     int    `json:"size"`
	Checksum string `json:"checksum,omitempty"` // xxhash64 of the bytes, 16 hex digits
	Tier     string `json:"tier,omitempty"`     // get: the tier that served it
	File     string `json:"file,omitempty"`     // get: where it was written ("-": stdout)
	Error    string `json:"error,omitempty"`    // put: why the block was not stored
}

func (a *app) newPutCommand() *cobra.Command {
	var parent string
	cmd := &cobra.Command{
		Use:   "put KEY FILE [KEY FILE ...]",
		Short: "Store files as blocks",
		Long: `put stores the bytes of each FILE as the block KEY on the node at --addr,
and prints KEY SIZE CHECKSUM for each (SIZE in bytes, CHECKSUM the xxhash64
of the bytes, 16 hex digits, the one the node keeps with the block).

KEY is NS/HASH, 16 hex digits each or 0x and up to 16 (NS may be redis).
--parent names the block before a single KEY in its chain, so that eviction takes it first.
A file must fit the node's block limit (kvctl stats shows it).`,
		Example: `  # One block, the second of its chain
  kvctl put 9f86d081884c7d65/1111111111111111 block1.bin --parent 0123456789abcdef

  # Several blocks at once
  kvctl put 9f86d081884c7d65/0123456789abcdef a.bin 9f86d081884c7d65/1111111111111111 b.bin`,
		RunE: func(cmd *cobra.Command, args []string) error { return a.runPut(cmd.Context(), args, parent) },
	}
	cmd.Flags().StringVar(&parent, "parent", "", "hash of the block before KEY in its chain (one KEY FILE pair only)")
	return cmd
}

func (a *app) runPut(ctx context.Context, args []string, parent string) error {
	var probs []string
	if len(args) == 0 || len(args)%2 != 0 {
		probs = append(probs, fmt.Sprintf("put takes KEY FILE pairs, got %d arguments", len(args)))
	}
	blocks := make([]client.Block, 0, len(args)/2)
	for i := 0; i+1 < len(args); i += 2 {
		k, err := index.ParseKey(args[i])
		if err != nil {
			probs = append(probs, err.Error())
		}
		blocks = append(blocks, client.Block{Key: k})
	}
	if parent != "" {
		h, err := index.ParseHash(parent)
		switch {
		case err != nil:
			probs = append(probs, "--parent: "+err.Error())
		case len(blocks) != 1:
			probs = append(probs, fmt.Sprintf("--parent names the parent of one block, and %d are given", len(blocks)))
		default:
			blocks[0].Parent, blocks[0].HasParent = h, true
		}
	}
	if len(probs) > 0 {
		return usageErrorf("put: %s", strings.Join(probs, "; "))
	}
	for i := range blocks {
		data, err := os.ReadFile(args[2*i+1])
		if err != nil {
			return fmt.Errorf("put: %w", err)
		}
		blocks[i].Data = data
	}
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	err = c.Put(ctx, blocks)
	var be *client.BatchError
	if err != nil && !errors.As(err, &be) {
		return fmt.Errorf("put: %w", err)
	}
	rows := make([]blockRow, len(blocks))
	var failed []string
	for i, b := range blocks {
		rows[i] = blockRow{Key: b.Key.String(), Found: true, Size: len(b.Data), Checksum: checksumHex(index.Checksum(b.Data))}
		if be != nil && be.Errs[i] != nil {
			rows[i].Found, rows[i].Error = false, be.Errs[i].Error()
			failed = append(failed, rows[i].Key+": "+rows[i].Error)
		}
	}
	if err := a.writeBlockRows(a.stdout, rows, false); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("put: %d of %d blocks were not stored; %s", len(failed), len(blocks), failed[0])
	}
	return nil
}

func (a *app) newGetCommand() *cobra.Command {
	var dir, out string
	cmd := &cobra.Command{
		Use:   "get KEY [KEY...] [-O DIR | --out FILE]",
		Short: "Fetch blocks into files",
		Long: `get fetches the blocks KEY (NS/HASH, 16 hex digits each) from the node at
--addr and writes their bytes: with -O DIR, each to DIR/NS-HASH; with
--out FILE, the one KEY to FILE; with neither, the one KEY to stdout (which
must not be a terminal), the table then going to stderr so that stdout
carries nothing but the block's bytes.

It prints KEY SIZE CHECKSUM TIER for each block: SIZE in bytes, CHECKSUM the
xxhash64 of the bytes (checked against the node's on arrival), TIER the tier
that served it. Blocks travel over gRPC, which names the serving tier.

A key the node does not hold is reported (TIER missing) and makes the exit
status 1; the blocks found are written all the same.`,
		Example: `  # One block to a file, then to a pipe
  kvctl get 9f86d081884c7d65/0123456789abcdef --out block.bin
  kvctl get 9f86d081884c7d65/0123456789abcdef | xxd | head

  # Several blocks into a directory
  kvctl get 9f86d081884c7d65/0123456789abcdef 9f86d081884c7d65/1111111111111111 -O blocks/`,
		RunE: func(cmd *cobra.Command, args []string) error { return a.runGet(cmd.Context(), args, dir, out) },
	}
	cmd.Flags().StringVarP(&dir, "dir", "O", "", "write each block to DIR/NS-HASH (DIR is created if missing)")
	cmd.Flags().StringVar(&out, "out", "", "write the one block to FILE")
	return cmd
}

func (a *app) runGet(ctx context.Context, args []string, dir, out string) error {
	var probs []string
	keys := make([]index.Key, 0, len(args))
	for _, s := range args {
		k, err := index.ParseKey(s)
		if err != nil {
			probs = append(probs, err.Error())
		}
		keys = append(keys, k)
	}
	toStdout := dir == "" && out == ""
	switch {
	case len(args) == 0:
		probs = append(probs, "no keys given")
	case dir != "" && out != "":
		probs = append(probs, "-O and --out do not go together")
	case out != "" && len(args) > 1:
		probs = append(probs, fmt.Sprintf("--out takes one block, and %d keys are given: use -O DIR", len(args)))
	case toStdout && len(args) > 1:
		probs = append(probs, fmt.Sprintf("stdout takes one block, and %d keys are given: use -O DIR", len(args)))
	case toStdout && a.interactive(a.stdout):
		probs = append(probs, "refusing to write a block's bytes to the terminal: use --out FILE or -O DIR, or redirect stdout")
	}
	if len(probs) > 0 {
		return usageErrorf("get: %s", strings.Join(probs, "; "))
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("get: %w", err)
		}
	}
	c, err := a.connect(ctx, client.Options{NoDataPlane: true}) // gRPC says which tier served a block
	if err != nil {
		return err
	}
	// Blocks held on other nodes of a cluster are fetched from them.
	cl := client.NewClusterClient(c, client.Options{NoDataPlane: true, Timeout: a.timeout})
	defer cl.Close()
	seed := index.NodeID(c.Info().NodeId)
	rows := make([]blockRow, len(keys))
	var missing []string
	err = cl.GetFunc(ctx, keys, client.GetOptions{}, func(i int, r client.Result) error {
		if r.Found && r.Node != 0 && r.Node != seed {
			r.Tier = fmt.Sprintf("%s (node %d)", r.Tier, r.Node)
		}
		row := &rows[i]
		*row = blockRow{Key: keys[i].String(), Found: r.Found, Tier: "missing"}
		if !r.Found {
			missing = append(missing, row.Key)
			return nil
		}
		row.Size, row.Checksum, row.Tier = len(r.Data), checksumHex(index.Checksum(r.Data)), r.Tier
		switch {
		case toStdout:
			row.File = "-"
			_, err := a.stdout.Write(r.Data)
			return err
		case out != "":
			row.File = out
		default:
			row.File = filepath.Join(dir, keys[i].NS.String()+"-"+keys[i].Hash.String())
		}
		return writeFileAtomic(row.File, r.Data)
	})
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	report := a.stdout
	if toStdout {
		report = a.stderr
	}
	if err := a.writeBlockRows(report, rows, true); err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("get: %d of %d keys not found: %s", len(missing), len(keys), strings.Join(missing, ", "))
	}
	return nil
}

// writeBlockRows writes rows as a table (KEY SIZE CHECKSUM, and TIER for a
// get) or as JSON.
func (a *app) writeBlockRows(w io.Writer, rows []blockRow, withTier bool) error {
	if a.output == outputJSON {
		return writeJSON(w, rows)
	}
	header := []string{"KEY", "SIZE", "CHECKSUM"}
	if withTier {
		header = append(header, "TIER")
	}
	cells := make([][]string, 0, len(rows))
	for _, r := range rows {
		c := []string{r.Key, strconv.Itoa(r.Size), r.Checksum}
		switch {
		case r.Error != "":
			c[2] = "not stored"
		case !r.Found:
			c[1], c[2] = "-", "-"
		}
		if withTier {
			c = append(c, r.Tier)
		}
		cells = append(cells, c)
	}
	return writeTable(w, header, cells)
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory, so that a failed get leaves no half-written block behind.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
