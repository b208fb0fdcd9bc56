package resp

import "fmt"

// maxPatternLen bounds a SCAN MATCH or KEYS pattern, and so the work of
// matching one key: at most the key's length times the pattern's.
const maxPatternLen = 1024

// glob is a compiled Redis glob pattern: * matches any run of bytes, ?
// any byte, [abc], [a-z] and [^…] a byte of (or not of) the class, and a
// backslash makes the next byte literal. It matches as Redis's
// stringmatchlen does, quirks included (an unterminated class runs to the
// pattern's end; in [a-] the range ends at ']'), but without recursion:
// one pass that backtracks only to the last star, so no pattern takes more
// than len(pattern)×len(key) steps.
type glob struct {
	toks []globTok
	all  bool // the pattern matches every key (only stars)
}

type globKind uint8

const (
	globLit globKind = iota
	globAny
	globStar
	globClass
)

type globTok struct {
	kind   globKind
	b      byte
	neg    bool
	ranges [][2]byte // of a class; a single byte is a range of one
}

func (t *globTok) matches(c byte) bool {
	switch t.kind {
	case globLit:
		return c == t.b
	case globAny:
		return true
	case globClass:
		in := false
		for _, r := range t.ranges {
			if r[0] <= c && c <= r[1] {
				in = true
				break
			}
		}
		return in != t.neg
	}
	return false
}

// compileGlob compiles pattern, or says why it will not.
func compileGlob(pattern []byte) (*glob, error) {
	if len(pattern) > maxPatternLen {
		return nil, fmt.Errorf("pattern is %d bytes, over the limit of %d", len(pattern), maxPatternLen)
	}
	g := &glob{}
	p := pattern
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '*':
			if n := len(g.toks); n == 0 || g.toks[n-1].kind != globStar {
				g.toks = append(g.toks, globTok{kind: globStar})
			}
			continue
		case '?':
			g.toks = append(g.toks, globTok{kind: globAny})
		case '[':
			t := globTok{kind: globClass}
			i++
			if i < len(p) && p[i] == '^' {
				t.neg = true
				i++
			}
			for ; ; i++ {
				switch {
				case i < len(p) && p[i] == '\\' && len(p)-i >= 2:
					i++
					t.ranges = append(t.ranges, [2]byte{p[i], p[i]})
					continue
				case i < len(p) && p[i] == ']':
				case i >= len(p):
					i = len(p) - 1 // an unterminated class ends the pattern
				case len(p)-i >= 3 && p[i+1] == '-':
					lo, hi := p[i], p[i+2]
					if lo > hi {
						lo, hi = hi, lo
					}
					t.ranges = append(t.ranges, [2]byte{lo, hi})
					i += 2
					continue
				default:
					t.ranges = append(t.ranges, [2]byte{p[i], p[i]})
					continue
				}
				break
			}
			g.toks = append(g.toks, t)
		case '\\':
			if len(p)-i >= 2 {
				i++
			}
			g.toks = append(g.toks, globTok{kind: globLit, b: p[i]})
		default:
			g.toks = append(g.toks, globTok{kind: globLit, b: p[i]})
		}
	}
	g.all = len(g.toks) == 1 && g.toks[0].kind == globStar
	return g, nil
}

// match reports whether s matches the pattern: greedily, going back to
// the last star met, which is enough when * is the only token that
// matches runs of bytes.
func (g *glob) match(s string) bool {
	if g.all {
		return true
	}
	toks := g.toks
	p, i := 0, 0
	star, from := -1, 0 // the last star's token, and where its run ends
	for i < len(s) {
		switch {
		case p < len(toks) && toks[p].kind == globStar:
			star, from = p, i
			p++
		case p < len(toks) && toks[p].matches(s[i]):
			p++
			i++
		case star >= 0:
			from++
			p, i = star+1, from
		default:
			return false
		}
	}
	for p < len(toks) && toks[p].kind == globStar {
		p++
	}
	return p == len(toks)
}
