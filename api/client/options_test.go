package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
)

func TestOptionsDefaultsAreValid(t *testing.T) {
	var o client.Options
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if o.Timeout != 30*time.Second || o.RetryBudget != client.DefaultRetryBudget || o.Backoff != 50*time.Millisecond ||
		o.MaxBackoff != time.Second || o.PoolSize != 8 || o.MaxRetries <= 0 {
		t.Errorf("defaults %+v", o)
	}
	long := client.Options{Backoff: 3 * time.Second}
	long.EnsureDefaults()
	if err := long.Validate(); err != nil || long.MaxBackoff != 3*time.Second {
		t.Errorf("a 3s Backoff defaults MaxBackoff to %v (%v), want 3s", long.MaxBackoff, err)
	}
}

func TestDialRefusesInvalidOptionsNamingEachField(t *testing.T) {
	opts := client.Options{Timeout: -time.Second, RetryBudget: -1, Backoff: 2 * time.Second, MaxBackoff: time.Second, PoolSize: -3}
	// Nothing listens there: the options are refused before any dial.
	_, err := client.Dial(context.Background(), "127.0.0.1:1", opts)
	if !errors.Is(err, client.ErrInvalidOptions) {
		t.Fatalf("Dial with bad options: %v, want ErrInvalidOptions", err)
	}
	for _, want := range []string{"Timeout is -1s", "RetryBudget is -1ns", "MaxBackoff 1s is shorter than Backoff 2s", "PoolSize is -3"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
