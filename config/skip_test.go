package config

import (
	"slices"
	"strings"
	"testing"
)

// cluster.skip-entries is read from a flag, the environment or the file,
// as a list of raft log indices.
func TestClusterSkipEntriesParses(t *testing.T) {
	l, err := Load("", noEnv, map[string]string{"cluster-skip-entries": " 8, 18446744073709551615,,"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParseSkipEntries(l.Cluster.SkipEntries); err != nil || !slices.Equal(got, []uint64{8, 1<<64 - 1}) {
		t.Fatalf("--cluster-skip-entries: %v %v, want [8 18446744073709551615]", got, err)
	}
	l, err = Load("", func(k string) string {
		return map[string]string{"KVSTRATA_CLUSTER_SKIP_ENTRIES": "12"}[k]
	}, nil)
	if err != nil || l.Cluster.SkipEntries != "12" || l.Sources["cluster.skip-entries"] != FromEnv {
		t.Fatalf("KVSTRATA_CLUSTER_SKIP_ENTRIES: %q from %s, %v", l.Cluster.SkipEntries, l.Sources["cluster.skip-entries"], err)
	}
	l, err = Load(writeFile(t, "[cluster]\nskip-entries = 7\n"), noEnv, nil)
	if got, _ := ParseSkipEntries(l.Cluster.SkipEntries); err != nil || !slices.Equal(got, []uint64{7}) {
		t.Fatalf("config file skip-entries = 7: %v %v", got, err)
	}
	if got, err := ParseSkipEntries(Default().Cluster.SkipEntries); err != nil || got != nil {
		t.Fatalf("default: %v %v, want none", got, err)
	}
}

func TestClusterSkipEntriesRefusesWhatIsNoIndex(t *testing.T) {
	for _, bad := range []string{"abc", "-1", "0", "8,abc", "1.5", "18446744073709551616", "8 9"} {
		_, err := Load("", noEnv, map[string]string{"cluster-skip-entries": bad})
		if err == nil {
			t.Errorf("--cluster-skip-entries %q was accepted", bad)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "cluster.skip-entries") || !strings.Contains(msg, "is not a raft log index (a whole number > 0)") {
			t.Errorf("--cluster-skip-entries %q: error %q does not name the setting and what it wants", bad, msg)
		}
	}
}
