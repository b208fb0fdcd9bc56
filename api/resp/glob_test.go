package resp

import (
	"strings"
	"testing"
)

// redisMatch is Redis's stringmatchlen (util.c, case-sensitive), ported
// as it is, recursion and quirks included: the reference glob is checked
// against. Reading past the end of the pattern gives 0, as the NUL after
// a C string does.
func redisMatch(p string, i int, s string, skip *bool, nesting int) bool {
	if nesting > 1000 {
		return false
	}
	at := func(k int) byte {
		if k < len(p) {
			return p[k]
		}
		return 0
	}
	for len(p)-i > 0 && len(s) > 0 {
		switch p[i] {
		case '*':
			for len(p)-i > 0 && at(i+1) == '*' {
				i++
			}
			if len(p)-i == 1 {
				return true
			}
			for len(s) > 0 {
				if redisMatch(p, i+1, s, skip, nesting+1) {
					return true
				}
				if *skip {
					return false
				}
				s = s[1:]
			}
			*skip = true
			return false
		case '?':
			s = s[1:]
		case '[':
			i++
			not := at(i) == '^'
			if not {
				i++
			}
			match := false
			for {
				if at(i) == '\\' && len(p)-i >= 2 {
					i++
					if p[i] == s[0] {
						match = true
					}
				} else if at(i) == ']' {
					break
				} else if len(p)-i == 0 {
					i--
					break
				} else if len(p)-i >= 3 && p[i+1] == '-' {
					lo, hi := p[i], p[i+2]
					if lo > hi {
						lo, hi = hi, lo
					}
					i += 2
					if s[0] >= lo && s[0] <= hi {
						match = true
					}
				} else if p[i] == s[0] {
					match = true
				}
				i++
			}
			if not {
				match = !match
			}
			if !match {
				return false
			}
			s = s[1:]
		case '\\':
			if len(p)-i >= 2 {
				i++
			}
			fallthrough
		default:
			if p[i] != s[0] {
				return false
			}
			s = s[1:]
		}
		i++
		if len(s) == 0 {
			for at(i) == '*' {
				i++
			}
			break
		}
	}
	return len(p)-i == 0 && len(s) == 0
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true}, {"*", "anything", true}, {"**", "", true},
		{"p*", "prompt:1", true}, {"p*", "chunk", false},
		{"h?llo", "hello", true}, {"h?llo", "hllo", false},
		{"h[ae]llo", "hallo", true}, {"h[ae]llo", "hillo", false},
		{"h[^e]llo", "hallo", true}, {"h[^e]llo", "hello", false},
		{"h[a-b]llo", "hbllo", true}, {"h[b-a]llo", "hbllo", true}, {"h[a-b]llo", "hcllo", false},
		{`h\*llo`, "h*llo", true}, {`h\*llo`, "hello", false},
		{`a\`, `a\`, true},
		{"[abc", "b", true}, // an unterminated class runs to the end
		{"a*b*c", "aXbYc", true}, {"a*b*c", "aXbY", false},
		{"*a*a*a*a*b", strings.Repeat("a", 100), false},
		{"", "", true}, {"", "a", false},
	} {
		g, err := compileGlob([]byte(tc.pattern))
		if err != nil {
			t.Fatal(err)
		}
		if got := g.match(tc.s); got != tc.want {
			t.Errorf("%q matching %q: %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
	if _, err := compileGlob([]byte(strings.Repeat("*", maxPatternLen+1))); err == nil {
		t.Error("a pattern over maxPatternLen compiled")
	}
}

// FuzzGlob checks the glob against Redis's own matcher, on keys that are
// not empty (Redis's matcher, unlike KEYS * and SCAN, never matches "").
func FuzzGlob(f *testing.F) {
	for _, seed := range [][2]string{
		{"*", "a"}, {"p*", "prompt"}, {"h[^e]l?o", "hallo"}, {`[\]a-]x`, "]x"}, {"[a-]x", "bx"},
		{"[", "a"}, {"[^", "a"}, {`\`, `\`}, {"*a*b*", "xaxbx"}, {"[]a]", "a"}, {"a[", "a"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, pattern, s string) {
		if len(pattern) > 24 || len(s) > 24 || s == "" {
			return
		}
		g, err := compileGlob([]byte(pattern))
		if err != nil {
			t.Fatal(err)
		}
		skip := false
		if got, want := g.match(s), redisMatch(pattern, 0, s, &skip, 0); got != want {
			t.Fatalf("%q matching %q: %v, Redis says %v", pattern, s, got, want)
		}
	})
}
