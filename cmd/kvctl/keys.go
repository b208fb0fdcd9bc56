package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
)

// fileLine is one line of a list file, with its number for messages.
type fileLine struct {
	n    int
	text string
}

// readList reads a file of one item a line; blank lines and lines starting
// with # are skipped, spaces around items trimmed.
func readList(path string) ([]fileLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []fileLine
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		t := strings.TrimSpace(sc.Text())
		if t != "" && !strings.HasPrefix(t, "#") {
			out = append(out, fileLine{n, t})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

// readKeys reads a file of keys, one NS/HASH a line.
func readKeys(path string) ([]index.Key, error) {
	lines, err := readList(path)
	if err != nil {
		return nil, err
	}
	keys := make([]index.Key, 0, len(lines))
	for _, l := range lines {
		k, err := index.ParseKey(l.text)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, l.n, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// readHashes reads a file of hashes, one a line.
func readHashes(path string) ([]index.Hash, error) {
	lines, err := readList(path)
	if err != nil {
		return nil, err
	}
	hashes := make([]index.Hash, 0, len(lines))
	for _, l := range lines {
		h, err := index.ParseHash(l.text)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, l.n, err)
		}
		hashes = append(hashes, h)
	}
	return hashes, nil
}

// parseSize parses a byte count with an optional unit, as kvstrata's
// config does: 4096, 64KiB, 1.5GiB, 10GB.
func parseSize(s string) (int64, error) { return units.ParseBytes(s) }

// formatBytes formats n for a person: "512 B", "5.0 GiB".
func formatBytes[T ~int64 | ~uint64 | ~int | ~uint32](n T) string { return units.FormatBytes(int64(n)) }

// thousands formats n with commas between groups of three digits.
func thousands[T ~int64 | ~uint64 | ~int | ~uint32](n T) string {
	s := strconv.FormatInt(int64(n), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// count writes n and a noun, plural unless n is 1: "1 block", "1,234 blocks".
func count[T ~int64 | ~uint64 | ~int | ~uint32](n T, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return thousands(n) + " " + noun + "s"
}

// checksumHex writes a block checksum as kvctl prints it.
func checksumHex(sum uint64) string { return fmt.Sprintf("%016x", sum) }
