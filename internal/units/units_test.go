package units

import "testing"

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 512: "512 B", 1023: "1023 B", 1024: "1.0 KiB", 64 << 10: "64.0 KiB",
		5 << 20: "5.0 MiB", 3 << 29: "1.5 GiB", 1 << 50: "1.0 PiB", -2048: "-2.0 KiB",
	} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"4096": 4096, "64KiB": 64 << 10, "4 MiB": 4 << 20, "1.5GiB": 3 << 29, "10GB": 10e9, "2k": 2048, " 7 b ": 7,
	} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "4 parsecs", "1e400", "NaN", "1..2k", "9999999999999TiB"} {
		if got, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, got)
		}
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"4096", "64KiB", "1.5 GiB", "1e6", "-3", "k", "9999999999999TiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBytes(s)
		if err == nil && (n < 0 || n > 1<<62) {
			t.Fatalf("ParseBytes(%q) = %d, outside [0, 2^62]", s, n)
		}
	})
}
