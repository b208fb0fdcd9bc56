package config

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Source says which layer set a value.
type Source string

// The layers, lowest precedence first.
const (
	FromDefault Source = "default"
	FromFile    Source = "file"
	FromEnv     Source = "env"
	FromFlag    Source = "flag"
)

// Loaded is a configuration with the layer each setting came from.
type Loaded struct {
	Config
	Sources map[string]Source // by setting key
	File    string            // the config file read, if any
}

// Load builds the configuration: defaults, then the TOML file at path (if
// not empty), then the KVSTRATA_ environment variables env returns, then
// flags, a map from flag name to the value given on the command line. It
// reports every problem — unknown file keys, unparsable values, invalid
// settings — in one *Error.
func Load(path string, env func(string) string, flags map[string]string) (*Loaded, error) {
	l := &Loaded{Config: Default(), Sources: map[string]Source{}, File: path}
	settings := l.Settings()
	byKey := map[string]*Setting{}
	for _, s := range settings {
		byKey[s.Key] = s
		l.Sources[s.Key] = FromDefault
	}
	var probs []string
	if path != "" {
		values, err := readFile(path)
		if err != nil {
			return nil, &Error{Problems: []string{err.Error()}}
		}
		keys := make([]string, 0, len(values))
		for k := range values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			s := byKey[k]
			if s == nil {
				probs = append(probs, fmt.Sprintf("config file %s: unknown key %q%s", path, k, suggest(k, settings)))
				continue
			}
			if err := s.Set(values[k]); err != nil {
				probs = append(probs, fmt.Sprintf("config file %s: %v", path, err))
				continue
			}
			l.Sources[k] = FromFile
		}
	}
	for _, s := range settings {
		if v := env(s.Env()); v != "" {
			if err := s.Set(v); err != nil {
				probs = append(probs, fmt.Sprintf("environment %s: %v", s.Env(), err))
				continue
			}
			l.Sources[s.Key] = FromEnv
		}
	}
	for _, s := range settings {
		if v, ok := flags[s.Flag()]; ok {
			if err := s.Set(v); err != nil {
				probs = append(probs, fmt.Sprintf("flag --%s: %v", s.Flag(), err))
				continue
			}
			l.Sources[s.Key] = FromFlag
		}
	}
	if err := l.Validate(); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			probs = append(probs, ce.Problems...)
		}
	}
	if len(probs) > 0 {
		return nil, &Error{Problems: probs}
	}
	return l, nil
}

// readFile reads a TOML file into setting keys and their values as text.
func readFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	out := map[string]string{}
	var walk func(prefix string, m map[string]any) error
	walk = func(prefix string, m map[string]any) error {
		for k, v := range m {
			key := prefix + k
			switch v := v.(type) {
			case map[string]any:
				if prefix != "" {
					return fmt.Errorf("config file %s: table %q is nested too deep", path, key)
				}
				if err := walk(key+".", v); err != nil {
					return err
				}
			case string:
				out[key] = v
			case int64:
				out[key] = strconv.FormatInt(v, 10)
			case float64:
				out[key] = strconv.FormatFloat(v, 'g', -1, 64)
			case bool:
				out[key] = strconv.FormatBool(v)
			default:
				return fmt.Errorf("config file %s: %s has a value of type %T; want a string, number or boolean", path, key, v)
			}
		}
		return nil
	}
	if err := walk("", raw); err != nil {
		return nil, err
	}
	return out, nil
}

// suggest names the known key closest to an unknown one, if any is close.
func suggest(key string, settings []*Setting) string {
	best, bestD := "", 4
	for _, s := range settings {
		if d := distance(key, s.Key); d < bestD {
			best, bestD = s.Key, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// Format writes c as a TOML config file, each value annotated with the layer
// it came from, so that `kvstrata serve --print-config` output can be saved
// and loaded back.
func (l *Loaded) Format() string {
	var b strings.Builder
	section := ""
	settings := l.Settings()
	// Top-level keys first: TOML puts everything after a [table] into it.
	slices.SortStableFunc(settings, func(x, y *Setting) int {
		return strings.Count(x.Key, ".") - strings.Count(y.Key, ".")
	})
	for _, s := range settings {
		key := s.Key
		if i := strings.IndexByte(key, '.'); i >= 0 {
			if sec := key[:i]; sec != section {
				section = sec
				fmt.Fprintf(&b, "\n[%s]\n", sec)
			}
			key = key[i+1:]
		}
		src := string(l.Sources[s.Key])
		switch l.Sources[s.Key] {
		case FromEnv:
			src += " " + s.Env()
		case FromFlag:
			src += " --" + s.Flag()
		}
		fmt.Fprintf(&b, "%s = %s  # %s; %s\n", key, quote(s), s.Usage, src)
	}
	return b.String()
}

// quote writes a setting's value as a TOML literal that reads back as the
// same value: a number or a boolean bare, anything else as a basic string;
// a secret that is set prints as "<redacted>".
func quote(s *Setting) string {
	v := s.Value()
	switch {
	case s.Secret && v != "":
		return `"<redacted>"`
	case s.Bool && (v == "true" || v == "false"), s.number && tomlNumber.MatchString(v):
		return v
	}
	return tomlString(v)
}

// tomlNumber matches the decimal numbers TOML and strconv write alike
// ("-3", "0.95", "1e+06"); not "NaN", "Inf", "0x10" or "007".
var tomlNumber = regexp.MustCompile(`^[+-]?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// tomlString writes v as a TOML basic string. TOML has no escape for
// invalid UTF-8, which Validate refuses.
func tomlString(v string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range v {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
