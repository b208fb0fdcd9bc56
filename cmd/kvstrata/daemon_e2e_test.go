package main

import (
	"strings"
	"testing"
)

// A lone node elects itself on every start; that is how it starts, not a
// fault, so nothing before "kvstrata serving" warns — on a first start and
// on a restart over the same data.
func TestLoneNodeStartsWithoutWarnings(t *testing.T) {
	p := startNode(t, t.TempDir())
	checkQuietStart(t, p.log.String())
	p.stop()
	p.restart()
	checkQuietStart(t, p.log.String())
	p.stop()
}

// checkQuietStart fails if log has a WARN or ERROR line before the node
// says it is serving.
func checkQuietStart(t *testing.T, log string) {
	t.Helper()
	before, _, ok := strings.Cut(log, `msg="kvstrata serving"`)
	if !ok {
		t.Fatalf("no \"kvstrata serving\" line:\n%s", log)
	}
	for _, line := range strings.Split(before, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("a normal start logs %s\nwhole log:\n%s", line, log)
		}
	}
}
