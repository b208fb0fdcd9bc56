package ssd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// The crash test runs this test binary again as a child process that
// writes to a tier until the parent kills it with SIGKILL, then reopens
// the tier and checks every block the child touched.
const (
	crashDirEnv  = "KVSTRATA_SSD_CRASH_DIR"
	crashModeEnv = "KVSTRATA_SSD_CRASH_MODE"
	crashSeedEnv = "KVSTRATA_SSD_CRASH_SEED"
	crashFileEnv = "KVSTRATA_SSD_CRASH_FILE_MIN"

	crashKeys    = 1000     // hashes the child writes
	crashMaxSize = 64 << 10 // largest block it puts
	crashRounds  = 3        // kills per durability mode
	// crashFileMin is the FileMinSize of the runs with block files: most
	// blocks the child puts go to files.
	crashFileMin = 4 << 10
)

// TestCrashChild is the child side of TestCrashRecovery; run on its own
// it skips. It prints, unbuffered, one line per step:
//
//	op put <hash> <size>   before a Put
//	op del <hash>          before a Delete
//	op inv <hash>          before an Invalidate
//	ok                     when the op before it was acknowledged
//	flushed                when a Flush of everything acknowledged returned
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("the child process of TestCrashRecovery")
	}
	mode, _ := strconv.Atoi(os.Getenv(crashModeEnv))
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	fileMin, _ := strconv.ParseInt(os.Getenv(crashFileEnv), 10, 64)
	tr, err := Open(Config{
		Dir:           dir,
		Capacity:      1 << 40,
		MaxBlockSize:  crashMaxSize,
		Durability:    Durability(mode),
		FlushInterval: 100 * time.Millisecond,
		FileMinSize:   fileMin,
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 0))
	say := func(format string, args ...any) {
		if _, err := fmt.Fprintf(os.Stdout, format+"\n", args...); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; ; i++ {
		h := index.Hash(r.IntN(crashKeys))
		if op := r.IntN(16); op == 1 {
			say("op inv %d", h)
			if err := tr.Invalidate(index.Key{NS: 7, Hash: h}); err != nil {
				t.Fatal(err)
			}
		} else if op < 3 {
			say("op del %d", h)
			if err := tr.Delete(index.Key{NS: 7, Hash: h}); err != nil && !errors.Is(err, tiers.ErrNotFound) {
				t.Fatal(err)
			}
		} else {
			n := r.IntN(crashMaxSize + 1)
			say("op put %d %d", h, n)
			m, b := tiertest.Block(h, n)
			if err := tr.Put(m, b); err != nil {
				t.Fatal(err)
			}
		}
		say("ok")
		if i%64 == 0 {
			if err := tr.Flush(); err != nil {
				t.Fatal(err)
			}
			say("flushed")
		}
	}
}

// crashOp is one op the child started; size is -1 for a delete.
type crashOp struct {
	hash       index.Hash
	size       int
	invalidate bool // an Invalidate: durable once acknowledged
	acked      bool
	durable    bool // acknowledged, then flushed (or an Invalidate)
}

// TestCrashRecovery kills a writing child process with SIGKILL at random
// moments and checks, after each kill, that every block is intact or
// missing, never corrupt; that no write acknowledged before a Flush, and
// no acknowledged Invalidate, was lost; that Stats agree with Scan; and
// that the block files are exactly those the records name (the files of
// puts whose records the crash lost are swept). It runs in each
// durability mode with the default FileMinSize, where most of the
// child's blocks are inline, and with crashFileMin, where most are in
// block files. In both modes a crash may lose
// the writes acknowledged since the last flush: without a WAL those of
// the last FlushInterval, with Pebble's unsynced WAL the few still in its
// log buffer (see DurabilityWAL); the test logs how many it lost.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child processes")
	}
	type run struct {
		d       Durability
		fileMin int64
	}
	for _, c := range []run{{DurabilityFlush, 0}, {DurabilityWAL, 0}, {DurabilityFlush, crashFileMin}, {DurabilityWAL, crashFileMin}} {
		name := c.d.String()
		if c.fileMin > 0 {
			name += "/files"
		}
		d := c.d
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			r := rand.New(rand.NewPCG(seed, 1))
			// state is each hash's block size as last seen after a
			// reopen; a missing hash has no block.
			state := map[index.Hash]int{}
			var ops, lost int
			for round := range crashRounds {
				after := time.Duration(100+r.IntN(900)) * time.Millisecond
				log := runCrashChild(t, dir, d, c.fileMin, seed+uint64(round), after)
				ops += len(log)
				lost += checkAfterCrash(t, dir, d, c.fileMin, log, state)
			}
			if ops == 0 {
				t.Fatal("the child never got to write")
			}
			t.Logf("%d ops in %d rounds; %d keys lost their last acknowledged unflushed op; %d blocks left",
				ops, crashRounds, lost, len(state))
		})
	}
}

// runCrashChild runs the child on dir, kills it with SIGKILL the given
// time after its first op, and returns the ops it started.
func runCrashChild(t *testing.T, dir string, d Durability, fileMin int64, seed uint64, after time.Duration) []crashOp {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(),
		crashDirEnv+"="+dir,
		crashModeEnv+"="+strconv.Itoa(int(d)),
		crashSeedEnv+"="+strconv.FormatUint(seed, 10),
		crashFileEnv+"="+strconv.FormatInt(fileMin, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()

	var ops []crashOp
	flushed := 0 // ops before this index are flushed
	handle := func(line string) {
		f := strings.Fields(line)
		switch {
		case len(f) == 4 && f[0] == "op" && f[1] == "put":
			h, _ := strconv.ParseUint(f[2], 10, 64)
			n, _ := strconv.Atoi(f[3])
			ops = append(ops, crashOp{hash: index.Hash(h), size: n})
		case len(f) == 3 && f[0] == "op" && f[1] == "del":
			h, _ := strconv.ParseUint(f[2], 10, 64)
			ops = append(ops, crashOp{hash: index.Hash(h), size: -1})
		case len(f) == 3 && f[0] == "op" && f[1] == "inv":
			h, _ := strconv.ParseUint(f[2], 10, 64)
			ops = append(ops, crashOp{hash: index.Hash(h), size: -1, invalidate: true})
		case line == "ok" && len(ops) > 0:
			ops[len(ops)-1].acked = true
		case line == "flushed":
			flushed = len(ops)
		}
	}
	first, ok := <-lines
	if !ok {
		_ = cmd.Wait()
		t.Fatalf("the child wrote nothing: %s", stderr.String())
	}
	handle(first)
	kill := time.After(after)
	for killed := false; ; {
		select {
		case line, ok := <-lines:
			if !ok {
				err := cmd.Wait()
				if !killed {
					t.Fatalf("the child exited on its own (%v): %s", err, stderr.String())
				}
				for i := range ops {
					ops[i].durable = ops[i].acked && (i < flushed || ops[i].invalidate)
				}
				return ops
			}
			handle(line)
		case <-kill:
			must(t, cmd.Process.Signal(syscall.SIGKILL))
			killed = true
		}
	}
}

// checkAfterCrash reopens the tier on dir and checks every hash the child
// may have touched against what log allows, then updates state. It returns
// the number of hashes whose last op was acknowledged but did not survive.
func checkAfterCrash(t *testing.T, dir string, d Durability, fileMin int64, log []crashOp, state map[index.Hash]int) (lost int) {
	t.Helper()
	tr := openTest(t, Config{Dir: dir, Capacity: 1 << 40, MaxBlockSize: crashMaxSize, Durability: d, FileMinSize: fileMin})
	byHash := map[index.Hash][]crashOp{}
	for _, op := range log {
		byHash[op.hash] = append(byHash[op.hash], op)
	}
	present := 0
	for h := range index.Hash(crashKeys) {
		// The block may be in the state of the last durable op (or the
		// state before the round, without one) or of any later op.
		allowed := []int{-1}
		if n, ok := state[h]; ok {
			allowed[0] = n
		}
		for _, op := range byHash[h] {
			if op.durable {
				allowed = allowed[:0]
			}
			allowed = append(allowed, op.size)
		}
		got, gm, err := tr.Get(index.Key{NS: 7, Hash: h}, nil)
		size := -1
		switch {
		case err == nil:
			size = int(gm.Size)
			want, b := tiertest.Block(h, size)
			if gm != want || !bytes.Equal(got, b) {
				t.Fatalf("block %v is not a block the child put: %+v", h, gm)
			}
			present++
			state[h] = size
		case errors.Is(err, tiers.ErrNotFound):
			delete(state, h)
		default:
			t.Fatalf("block %v after the crash: %v", h, err)
		}
		if !slices.Contains(allowed, size) {
			t.Fatalf("block %v has size %d after the crash; its ops %+v allow only %v", h, size, byHash[h], allowed)
		}
		if ops := byHash[h]; len(ops) > 0 && ops[len(ops)-1].acked && ops[len(ops)-1].size != size {
			lost++
		}
	}
	s := tr.Stats()
	if s.Blocks != int64(present) {
		t.Fatalf("Stats says %d blocks, Get finds %d", s.Blocks, present)
	}
	checkAccounting(t, tr)
	checkBlockFiles(t, tr)
	must(t, tr.Close())
	return lost
}

// checkBlockFiles checks that the files in tr's block file directory are
// exactly those its records name, with the records' sizes.
func checkBlockFiles(t *testing.T, tr *Tier) {
	t.Helper()
	named := map[string]int64{}
	_, err := tr.eachRecord(nil, func(e *scanEntry) bool {
		if e.err == nil && e.gen != 0 {
			named[tr.files.path(e.key, e.gen)] = int64(e.meta.Size)
		}
		return true
	})
	must(t, err)
	onDisk := map[string]int64{}
	must(t, filepath.WalkDir(filepath.Join(tr.cfg.Dir, blocksDir), func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		onDisk[path] = info.Size()
		return nil
	}))
	if !maps.Equal(named, onDisk) {
		t.Fatalf("the records name %d block files, %d are on disk", len(named), len(onDisk))
	}
}
