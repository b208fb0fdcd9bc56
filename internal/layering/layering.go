// Package layering checks the import graph of the module against the
// layering rules written in docs/architecture.md, so that an arrow that
// points the wrong way fails `make test` with the import that broke it.
//
// A rule is one line of a fenced block tagged "layers":
//
//	api/client/...  !>  tiers/... raftstore/... config
//	api/node        =>  index tiers/... internal/...
//
// "A !> B" says no package matching A depends on a package matching B,
// directly or through others. "A => B" says every package of this module
// that a package matching A imports directly matches B (or A itself).
// A pattern is a package path relative to the module ("api/node"), or one
// ending in "/..." that also matches everything below it ("tiers/...").
// Only non-test imports count: tests may use any harness.
package layering

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Rule is one line of the rules.
type Rule struct {
	Line   int      // in the file it was read from, from 1
	Text   string   // as written
	From   []string // patterns of the packages the rule is about
	Forbid bool     // "!>": From must not depend on To; "=>": From imports only To
	To     []string
}

// Graph is a module's import graph: each package (relative path) and the
// module packages it imports directly.
type Graph map[string][]string

// Parse reads the rules of every fenced block tagged "layers" in r.
func Parse(r io.Reader) ([]Rule, error) {
	var rules []Rule
	sc := bufio.NewScanner(r)
	in := false
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case !in && line == "```layers":
			in = true
		case in && line == "```":
			in = false
		case in && line != "" && !strings.HasPrefix(line, "#"):
			r, err := parseRule(line)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			r.Line = n
			rules = append(rules, r)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if in {
		return nil, fmt.Errorf("a layers block is not closed")
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("no layers block")
	}
	return rules, nil
}

func parseRule(line string) (Rule, error) {
	r := Rule{Text: line}
	fields := strings.Fields(line)
	op := slices.IndexFunc(fields, func(f string) bool { return f == "!>" || f == "=>" })
	if op < 1 || op == len(fields)-1 && fields[op] == "!>" {
		return r, fmt.Errorf("%q: want \"PATTERNS !> PATTERNS\" or \"PATTERNS => PATTERNS\"", line)
	}
	r.Forbid = fields[op] == "!>"
	r.From, r.To = fields[:op], fields[op+1:]
	for _, p := range append(slices.Clone(r.From), r.To...) {
		if p == "" || strings.HasPrefix(p, "/") || strings.Contains(strings.TrimSuffix(p, "/..."), "...") {
			return r, fmt.Errorf("%q: bad pattern %q", line, p)
		}
	}
	return r, nil
}

// Match reports whether pkg matches any of patterns.
func Match(pkg string, patterns []string) bool {
	for _, p := range patterns {
		if base, ok := strings.CutSuffix(p, "/..."); ok {
			if pkg == base || strings.HasPrefix(pkg, base+"/") {
				return true
			}
		} else if pkg == p {
			return true
		}
	}
	return false
}

// Check returns one message for each way g breaks a rule, naming the
// rule's line and the chain of imports that breaks it; none if g keeps
// them all. A rule whose patterns match no package is a broken rule too,
// so that a renamed package cannot leave a rule checking nothing.
func Check(g Graph, rules []Rule) []string {
	pkgs := make([]string, 0, len(g))
	for p := range g {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	var out []string
	for _, r := range rules {
		for _, p := range append(slices.Clone(r.From), r.To...) {
			if !slices.ContainsFunc(pkgs, func(pkg string) bool { return Match(pkg, []string{p}) }) {
				out = append(out, fmt.Sprintf("line %d (%s): %s matches no package", r.Line, r.Text, p))
			}
		}
		for _, p := range pkgs {
			if !Match(p, r.From) {
				continue
			}
			if r.Forbid {
				if path := g.pathTo(p, r.To); path != nil {
					out = append(out, fmt.Sprintf("line %d (%s): %s", r.Line, r.Text, strings.Join(path, " → ")))
				}
				continue
			}
			for _, imp := range g[p] {
				if !Match(imp, r.To) && !Match(imp, r.From) {
					out = append(out, fmt.Sprintf("line %d (%s): %s imports %s", r.Line, r.Text, p, imp))
				}
			}
		}
	}
	return out
}

// pathTo returns the shortest chain of imports from pkg to a package
// matching to, or nil if there is none.
func (g Graph) pathTo(pkg string, to []string) []string {
	prev := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g[p] {
			if _, seen := prev[imp]; seen {
				continue
			}
			prev[imp] = p
			if Match(imp, to) {
				path := []string{imp}
				for q := p; q != ""; q = prev[q] {
					path = append(path, q)
				}
				slices.Reverse(path)
				return path
			}
			queue = append(queue, imp)
		}
	}
	return nil
}
