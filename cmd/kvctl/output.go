package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// outputFormat is the value of the persistent -o/--output flag.
type outputFormat string

const (
	outputTable outputFormat = "table" // aligned columns for people
	outputJSON  outputFormat = "json"  // an indented JSON document for programs
)

func (f *outputFormat) String() string { return string(*f) }

func (f *outputFormat) Set(s string) error {
	switch v := outputFormat(strings.ToLower(s)); v {
	case outputTable, outputJSON:
		*f = v
		return nil
	}
	return fmt.Errorf("want table or json")
}

func (f *outputFormat) Type() string { return "format" }

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeTable writes header and rows as columns aligned with spaces.
func writeTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// percent formats a fraction as a percentage with two decimals: "5.42%".
func percent(f float64) string { return strconv.FormatFloat(100*f, 'f', 2, 64) + "%" }

// points formats the difference of two fractions in percentage points.
func points(f float64) string { return strconv.FormatFloat(100*f, 'f', 2, 64) + " pp" }

// parseTokenCount parses a count of tokens written as a whole number
// (1000000), in scientific notation (1e6, 2.5e6) or with a decimal suffix
// k, M, G or T (1M, 2.5M, 500k), case-insensitive. It must come to a whole
// number between 1 and 10^15.
func parseTokenCount(s string) (int64, error) {
	const limit = 1e15
	bad := func(why string) error {
		return fmt.Errorf("token count %q %s (want a whole number like 1000000, 1e6 or 1M)", s, why)
	}
	t := strings.ReplaceAll(strings.TrimSpace(s), "_", "")
	if t == "" {
		return 0, bad("is empty")
	}
	mult := 1.0
	switch t[len(t)-1] {
	case 'k', 'K':
		mult = 1e3
	case 'm', 'M':
		mult = 1e6
	case 'g', 'G':
		mult = 1e9
	case 't', 'T':
		mult = 1e12
	}
	if mult != 1 {
		t = t[:len(t)-1]
	}
	if n, err := strconv.ParseInt(t, 10, 64); err == nil && mult == 1 {
		if n <= 0 || n > limit {
			return 0, bad("is out of range")
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || strings.ContainsAny(t, "xXpPnN") { // no hex floats, Inf or NaN
		return 0, bad("is not a number")
	}
	f *= mult
	switch {
	case f <= 0 || f > limit:
		return 0, bad("is out of range")
	case f != float64(int64(f)):
		return 0, bad("is not a whole number")
	}
	return int64(f), nil
}
