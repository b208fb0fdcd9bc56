package membership_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/membership"
)

func TestConfigDefaultsAndValidation(t *testing.T) {
	c := membership.Config{ID: 1, Dir: t.TempDir(), RaftAddr: "127.0.0.1:0"}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil || c.HeartbeatInterval != membership.DefaultHeartbeatInterval ||
		c.LivenessTimeout != membership.DefaultLivenessTimeout || c.Logger == nil {
		t.Fatalf("the defaults: %+v, %v", c, err)
	}
	_, err := membership.Open(membership.Config{HeartbeatInterval: time.Second, LivenessTimeout: time.Second})
	for _, want := range []string{"ID is 0", "Dir is empty", "RaftAddr is empty", "LivenessTimeout 1s is not over HeartbeatInterval 1s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open of a bad config: %v does not say %q", err, want)
		}
	}
}
