package sched

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/index"
)

var drivenEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newDriven is a driven engine over a sim model, both on one virtual clock.
func newDriven(t testing.TB, cfg Config) (*Engine, *sim.Model, *sim.VirtualClock) {
	t.Helper()
	clk := sim.NewVirtualClock(drivenEpoch)
	m, err := sim.New(sim.Config{Sleep: clk.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Model, cfg.Now = m, clk.Now
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := NewDriven(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e, m, clk
}

// drive steps e until it has nothing left to do, and returns the steps.
func drive(t testing.TB, e *Engine) int {
	t.Helper()
	for n := 1; ; n++ {
		if !e.Step() {
			return n
		}
		if n > 100000 {
			t.Fatal("the engine still has work after 100000 steps")
		}
	}
}

// stamped is one Output with the virtual time of the Step that produced it.
type stamped struct {
	Output
	at time.Time
}

// driveOutputs steps e until it is idle, taking ch's Outputs after each
// Step, stamped with the clock's time then.
func driveOutputs(t testing.TB, e *Engine, clk *sim.VirtualClock, ch <-chan Output) []stamped {
	t.Helper()
	var outs []stamped
	for n := 0; ; n++ {
		more := e.Step()
		for taken := true; taken; {
			select {
			case o, ok := <-ch:
				if ok {
					outs = append(outs, stamped{o, clk.Now()})
				}
				taken = ok
			default:
				taken = false
			}
		}
		if !more {
			return outs
		}
		if n > 100000 {
			t.Fatal("the engine still has work after 100000 steps")
		}
	}
}

func TestDrivenEngineRunsStepsInVirtualTimeWithTheirModelledDurations(t *testing.T) {
	e, m, clk := newDriven(t, Config{})
	p := prompt(100, 1)
	ch, err := e.Generate(context.Background(), Request{Prompt: p, MaxTokens: 4, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	outs := driveOutputs(t, e, clk, ch)

	// One Output a step: the prefill's token, then one per decode, each
	// stamped at the end of the step that made it.
	first := drivenEpoch.Add(m.PrefillTime(100, 1))
	wantAt := []time.Time{first}
	for i, at := 0, first; i < 3; i++ {
		at = at.Add(m.DecodeTime(101+i, 1))
		wantAt = append(wantAt, at)
	}
	var got []uint32
	for i, o := range outs {
		got = append(got, o.Tokens...)
		if i < len(wantAt) && !o.at.Equal(wantAt[i]) {
			t.Errorf("output %d at %v after the start, want %v (the modelled steps' times)", i, o.at.Sub(drivenEpoch), wantAt[i].Sub(drivenEpoch))
		}
	}
	if len(outs) != 4 {
		t.Fatalf("%d outputs, want 4 (one per step)", len(outs))
	}
	if w := want(m, p, 4); !slices.Equal(got, w) {
		t.Fatalf("tokens %v, want %v", got, w)
	}
	if last := outs[3]; last.Finish != FinishLength || last.Usage.CompletionTokens != 4 {
		t.Fatalf("last output %+v, want finish length with 4 completion tokens", last.Output)
	}
	if st := e.Stats(); st.Running+st.Waiting != 0 || st.Steps != 4 {
		t.Fatalf("stats after the request: %+v, want nothing running or waiting and 4 steps", st)
	}
}

// clockConn is a mapConn whose Load takes perBlock of the virtual clock a
// block, as the simulated replay's cache does.
type clockConn struct {
	*mapConn
	clk      *sim.VirtualClock
	perBlock time.Duration
}

func (c clockConn) Load(ctx context.Context, node string, ns index.NamespaceID, hashes []index.Hash, dst func(int) []byte) (int, error) {
	n, err := c.mapConn.Load(ctx, node, ns, hashes, dst)
	if err == nil {
		err = c.clk.Sleep(ctx, time.Duration(n)*c.perBlock)
	}
	return n, err
}

func TestDrivenEngineOnboardsInlineChargingTheConnectorsTime(t *testing.T) {
	conn := newMapConn()
	// A first engine computes the prompt and offloads its full blocks.
	a, _, _ := newDriven(t, Config{Connector: conn})
	p := prompt(100, 2) // 6 full blocks of 16, 4 tokens over
	ch, err := a.Generate(context.Background(), Request{Prompt: p, MaxTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, a)
	if _, last := collect(t, ch); last.Finish != FinishLength {
		t.Fatalf("first engine: %+v", last)
	}

	// A second one, with an empty pool, onboards them within its first
	// Step, the Load's time on its own clock before the prefill's.
	b, m, clk := newDriven(t, Config{})
	b.cfg.Connector = clockConn{conn, clk, time.Millisecond}
	ch, err = b.Generate(context.Background(), Request{Prompt: p, MaxTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	outs := driveOutputs(t, b, clk, ch)
	if len(outs) != 1 {
		t.Fatalf("%d outputs, want 1", len(outs))
	}
	o := outs[0]
	if o.Usage.OnboardedTokens != 96 || o.Usage.CachedTokens != 96 {
		t.Fatalf("usage %+v, want 96 tokens onboarded (6 blocks) and cached", o.Usage)
	}
	wantAt := drivenEpoch.Add(6*time.Millisecond + m.PrefillTime(4, 1))
	if !o.at.Equal(wantAt) {
		t.Fatalf("first token at %v, want %v: 6 blocks' load, then the prefill of the 4 tokens left", o.at.Sub(drivenEpoch), wantAt.Sub(drivenEpoch))
	}
	if st := b.Stats(); st.OnboardedTokens != 96 || st.Onboarding != 0 {
		t.Fatalf("stats %+v, want 96 onboarded tokens and no onboarding in flight", st)
	}
}

func TestDrivenEngineStoresAHandoffInline(t *testing.T) {
	conn := newMapConn()
	e, _, clk := newDriven(t, Config{Connector: conn})
	ch, err := e.Generate(context.Background(), Request{Prompt: prompt(40, 3), MaxTokens: 8,
		Transfer: &KVTransferParams{DoRemoteDecode: true}})
	if err != nil {
		t.Fatal(err)
	}
	outs := driveOutputs(t, e, clk, ch)
	last := outs[len(outs)-1]
	if last.Finish != FinishLength || last.Transfer == nil || len(last.Transfer.BlockHashes) != 2 || last.Transfer.CacheNode != mapConnNode {
		t.Fatalf("last output %+v, want the handoff's params naming 2 blocks at %s", last.Output, mapConnNode)
	}
	if len(conn.stores) != 1 {
		t.Fatalf("%d stores, want 1", len(conn.stores))
	}
}

func TestDrivenEngineCloseAbortsWhatIsLeft(t *testing.T) {
	e, _, _ := newDriven(t, Config{})
	ch, err := e.Generate(context.Background(), Request{Prompt: prompt(50, 4), MaxTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	e.Step() // prefilled, decoding
	e.Close()
	_, last := collect(t, ch)
	if last.Finish != FinishAbort || !errors.Is(last.Err, ErrClosed) {
		t.Fatalf("last output %+v, want an abort with ErrClosed", last)
	}
	if e.Step() {
		t.Fatal("Step after Close reported work")
	}
	e.Close() // twice is harmless
	if _, err := e.Generate(context.Background(), Request{Prompt: prompt(5, 5), MaxTokens: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Generate after Close: %v, want ErrClosed", err)
	}
}

func TestDrivenEngineTakesCancellationsAtTheNextStep(t *testing.T) {
	e, _, _ := newDriven(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Generate(ctx, Request{Prompt: prompt(50, 6), MaxTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	e.Step()
	cancel()
	// The cancellation is handed in by context.AfterFunc's goroutine.
	deadline := time.Now().Add(10 * time.Second)
	for posted := false; !posted; {
		e.mu.Lock()
		posted = len(e.inbox.cancelled) > 0
		e.mu.Unlock()
		if !posted && time.Now().After(deadline) {
			t.Fatal("the cancellation did not reach the engine's inbox within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	drive(t, e)
	_, last := collect(t, ch)
	if last.Finish != FinishAbort || !errors.Is(last.Err, context.Canceled) {
		t.Fatalf("last output %+v, want an abort with context.Canceled", last)
	}
	if st := e.Stats(); st.Pool.Free != st.Pool.Blocks {
		t.Fatalf("pool %+v after the cancellation, want every block free", st.Pool)
	}
}

func TestStepPanicsOnAnEngineRunningItsOwnLoop(t *testing.T) {
	e := newEngine(t, Config{Model: newSim(t)})
	defer func() {
		if recover() == nil {
			t.Fatal("Step on a goroutine-mode engine did not panic")
		}
	}()
	e.Step()
}
