package layering

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kvstrata/kvstrata"

// The module keeps every rule of docs/architecture.md, with and without
// the optional build tags.
func TestModuleKeepsTheLayeringRules(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the module")
	}
	f, err := os.Open(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rules, err := Parse(f)
	if err != nil {
		t.Fatalf("docs/architecture.md: %v", err)
	}
	g := Graph{}
	for _, tags := range []string{"", "ucx", "cuda"} {
		loadGraph(t, g, tags)
	}
	for _, msg := range Check(g, rules) {
		t.Errorf("docs/architecture.md %s", msg)
	}
}

// loadGraph adds the module's packages and their non-test imports of
// module packages, built with tags, to g.
func loadGraph(t *testing.T, g Graph, tags string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", tags, "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		pkg := rel(fields[0])
		for _, imp := range fields[1:] {
			if r := rel(imp); r != "" && !slices.Contains(g[pkg], r) {
				g[pkg] = append(g[pkg], r)
			}
		}
		if _, ok := g[pkg]; !ok {
			g[pkg] = nil
		}
	}
}

// rel returns a module package's path relative to the module, or "" for
// a package outside it.
func rel(pkg string) string {
	r, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return ""
	}
	return r
}

var spec = Graph{
	"index":        nil,
	"tiers":        {"index"},
	"tiers/dram":   {"tiers", "index"},
	"api/node":     {"tiers", "index"},
	"api/client":   {"index", "api/v1"},
	"api/v1":       {"index"},
	"cmd/kvstrata": {"api/node", "api/client"},
}

func rulesOf(t *testing.T, text string) []Rule {
	t.Helper()
	rules, err := Parse(strings.NewReader("```layers\n" + text + "\n```\n"))
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

func TestAKeptRuleSaysNothing(t *testing.T) {
	rules := rulesOf(t, "api/client/... !> tiers/... api/node\napi/node => index tiers/...\nindex => ")
	if msgs := Check(spec, rules); len(msgs) != 0 {
		t.Fatalf("rules kept, yet: %q", msgs)
	}
}

func TestAForbiddenDependencyNamesItsChain(t *testing.T) {
	g := Graph{}
	for k, v := range spec {
		g[k] = v
	}
	g["api/v1"] = []string{"index", "tiers/dram"} // api/client → api/v1 → tiers/dram
	msgs := Check(g, rulesOf(t, "api/client !> tiers/..."))
	if len(msgs) != 1 || !strings.Contains(msgs[0], "api/client → api/v1 → tiers/dram") || !strings.HasPrefix(msgs[0], "line 2 ") {
		t.Fatalf("got %q, want the chain api/client → api/v1 → tiers/dram on line 2", msgs)
	}
}

func TestAnImportOutsideTheAllowedListIsNamed(t *testing.T) {
	msgs := Check(spec, rulesOf(t, "api/node => index"))
	if len(msgs) != 1 || !strings.HasSuffix(msgs[0], "api/node imports tiers") {
		t.Fatalf("got %q, want api/node imports tiers", msgs)
	}
}

func TestARuleAboutNoPackageIsBroken(t *testing.T) {
	msgs := Check(spec, rulesOf(t, "api/cluster !> tiers/..."))
	if len(msgs) != 1 || !strings.Contains(msgs[0], "api/cluster matches no package") {
		t.Fatalf("got %q, want a rule matching nothing reported", msgs)
	}
}

func TestMalformedRulesAreRefused(t *testing.T) {
	for _, text := range []string{"```layers\napi/node tiers\n```", "```layers\n!> tiers\n```",
		"```layers\napi/node !>\n```", "```layers\napi/...x !> tiers\n```", "```layers\napi/node !> index\n", "no block"} {
		if _, err := Parse(strings.NewReader(text)); err == nil {
			t.Errorf("%q parsed", text)
		}
	}
}

func TestPatterns(t *testing.T) {
	for _, c := range []struct {
		pkg, pattern string
		want         bool
	}{
		{"tiers", "tiers/...", true}, {"tiers/dram", "tiers/...", true}, {"tiersx", "tiers/...", false},
		{"tiers/dram", "tiers", false}, {"tiers", "tiers", true},
	} {
		if got := Match(c.pkg, []string{c.pattern}); got != c.want {
			t.Errorf("Match(%q, %q) = %v", c.pkg, c.pattern, got)
		}
	}
}
