package config

import (
	"strings"
	"testing"
	"time"
)

func TestReconcileIntervalDefaultsToAMinuteAndRefusesNegative(t *testing.T) {
	c := Default()
	if c.Cluster.ReconcileInterval != time.Minute {
		t.Fatalf("default cluster.reconcile-interval %v; want 1m", c.Cluster.ReconcileInterval)
	}
	c.Cluster.ReconcileInterval = 0 // off
	if err := c.Validate(); err != nil && strings.Contains(err.Error(), "reconcile") {
		t.Fatalf("0 (off) refused: %v", err)
	}
	c.Cluster.ReconcileInterval = -time.Second
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "cluster.reconcile-interval -1s is negative") {
		t.Fatalf("a negative interval: %v", err)
	}
}
