package config

import (
	"os"
	"strings"
	"testing"
)

// The README's settings table lists every setting, with its flag and
// environment variable, and nothing else.
func TestTheREADMEListsEverySetting(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{} // key → the rest of its row
	for _, line := range strings.Split(string(raw), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		key := strings.Trim(strings.TrimSpace(cells[1]), "`")
		if strings.HasPrefix(strings.TrimSpace(cells[2]), "`--") {
			listed[key] = line
		}
	}
	c := Default()
	for _, s := range c.Settings() {
		row, ok := listed[s.Key]
		if !ok {
			t.Errorf("README: no row for setting %s", s.Key)
			continue
		}
		if !strings.Contains(row, "`--"+s.Flag()+"`") || !strings.Contains(row, "`"+s.Env()+"`") {
			t.Errorf("README: row of %s does not name --%s and %s", s.Key, s.Flag(), s.Env())
		}
		delete(listed, s.Key)
	}
	for key := range listed {
		t.Errorf("README: row for %s, which is no setting", key)
	}
}
