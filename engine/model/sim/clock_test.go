package sim

import (
	"testing"
	"time"
)

func TestAdvanceToMovesTheClockOnlyForward(t *testing.T) {
	clk := NewVirtualClock(epoch)
	clk.AdvanceTo(epoch.Add(time.Second))
	if got := clk.Now(); !got.Equal(epoch.Add(time.Second)) {
		t.Fatalf("after AdvanceTo(+1s) the clock reads %v, want %v", got, epoch.Add(time.Second))
	}
	clk.AdvanceTo(epoch) // earlier: nothing changes
	if got := clk.Now(); !got.Equal(epoch.Add(time.Second)) {
		t.Fatalf("after AdvanceTo(an earlier time) the clock reads %v, want it unchanged at %v", got, epoch.Add(time.Second))
	}
}
