package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/internal/lifecycle"
)

// reloading is a part that reads its files again when told.
type reloading struct {
	*part
	err error
}

func (p *reloading) Reload() error {
	p.j.add("reload " + p.name)
	return p.err
}

func TestReloadSignalReachesEveryReloaderInOrderWhileRunning(t *testing.T) {
	j := &journal{}
	a := &reloading{part: newPart(j, "a"), err: errors.New("bad certificate")}
	b := newPart(j, "b") // no Reload: skipped
	c := &reloading{part: newPart(j, "c")}
	hup := make(chan os.Signal)
	r, err := lifecycle.New(lifecycle.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Reload: hup}, a, b, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	hup <- syscall.SIGHUP // taken only once Run waits: every part has started
	hup <- syscall.SIGHUP // the first reload is over: a's failure did not stop the process
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	want := []string{"start a", "start b", "start c", "reload a", "reload c", "reload a", "reload c", "stop c", "stop b", "stop a"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("journal:\n got %q\nwant %q", got, want)
	}
}
