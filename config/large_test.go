package config

import (
	"strings"
	"testing"
)

// limits.max-value-size is bounded, and the RESP memory budget must hold
// a value while it grows (twice it) beside its command's name and key.
func TestMaxValueSizeIsChecked(t *testing.T) {
	for _, tc := range []struct {
		flags map[string]string
		want  string
	}{
		{map[string]string{"limits-max-value-size": "2GiB"}, "limits.max-value-size 2GiB outside (0, 1GiB]"},
		{map[string]string{"limits-max-value-size": "0"}, "limits.max-value-size 0 outside (0, 1GiB]"},
		{map[string]string{"limits-max-value-size": "512MiB", "limits-max-pending-resp-bytes": "1GiB"},
			"limits.max-pending-resp-bytes 1GiB is below 1025MiB (twice limits.max-value-size plus 1MiB"},
	} {
		_, err := Load("", noEnv, tc.flags)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.flags, err, tc.want)
		}
	}
	c, err := Load("", noEnv, map[string]string{"limits-max-value-size": "32MiB", "limits-max-pending-resp-bytes": "65MiB"})
	if err != nil || c.Limits.MaxValueSize != 32<<20 {
		t.Fatalf("32MiB values with 65MiB pending: %v", err)
	}
}
