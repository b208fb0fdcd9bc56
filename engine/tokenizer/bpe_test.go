package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func o200kT(tb testing.TB) *BPE {
	tb.Helper()
	tok, err := O200k()
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// The ids tiktoken (OpenAI's reference implementation) gives for o200k_base,
// as published in other tokenizers' test vectors.
func TestO200kKnownIDs(t *testing.T) {
	tok := o200kT(t)
	for _, c := range []struct {
		text string
		ids  []uint32
	}{
		{"", []uint32{}},
		{"hello world", []uint32{24912, 2375}},
		{"This is some text", []uint32{2500, 382, 1236, 2201}},
		{"hello 👋 world 🌍", []uint32{24912, 61138, 233, 2375, 130321, 235}},
		{" 日本語とEnglish 12345!\n", []uint32{17428, 40909, 5330, 28881, 220, 7633, 2548, 4175}},
		{"\x1ca", []uint32{216, 64}},
		{"a\n\n", []uint32{64, 279}},
	} {
		if got := tok.Encode(c.text); !slices.Equal(got, c.ids) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.ids)
		}
		if got := tok.Decode(c.ids); got != c.text {
			t.Errorf("Decode(%v) = %q, want %q", c.ids, got, c.text)
		}
	}
}

func TestO200kSpecialTokensArePlainTextWhenEncoded(t *testing.T) {
	tok := o200kT(t)
	// As tiktoken's encode_ordinary: the characters' tokens, not id 199999.
	want := []uint32{27, 91, 419, 1440, 919, 91, 29}
	if got := tok.Encode("<|endoftext|>"); !slices.Equal(got, want) {
		t.Errorf("Encode(<|endoftext|>) = %v, want the plain-text ids %v", got, want)
	}
	for _, id := range tok.Encode("x<|endoftext|>y<|endofprompt|>") {
		if id == 199999 || id == 200018 {
			t.Errorf("user text encoded to special id %d", id)
		}
	}
	if got := tok.Decode([]uint32{199999, 200018}); got != "<|endoftext|><|endofprompt|>" {
		t.Errorf("special ids decode to %q, want their text", got)
	}
}

func TestO200kVocabulary(t *testing.T) {
	tok := o200kT(t)
	if tok.VocabSize() != 200019 || tok.Name() != "o200k_base" {
		t.Fatalf("%s vocab size %d, want o200k_base's 200019", tok.Name(), tok.VocabSize())
	}
	for id := range uint32(199998) {
		if tok.Decode([]uint32{id}) == "" {
			t.Fatalf("mergeable id %d decodes to nothing", id)
		}
	}
	// Unassigned ids, and ids past the vocabulary, decode to nothing.
	for _, id := range []uint32{199998, 200000, 200017, 200019, 1 << 31, ^uint32(0)} {
		if got := tok.Decode([]uint32{24912, id, 2375}); got != "hello world" {
			t.Errorf("id %d inside hello world decodes to %q, want nothing for it", id, got)
		}
	}
}

var unicodeTexts = []string{
	"The quick brown fox jumps over the lazy dog.",
	"Grüße aus Köln — naïve café, œuvre, Ångström",
	"Привет, мир! Как дела?",
	"こんにちは世界。日本語のテキストです。",
	"你好，世界！中文文本测试。",
	"안녕하세요 세계",
	"مرحبا بالعالم",
	"שלום עולם",
	"नमस्ते दुनिया",
	"emoji: 🚀✅👨‍👩‍👧‍👦🏳️‍🌈 flags 🇫🇷🇯🇵",
	"math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ ≠ ∞",
	"code:\n\tfunc main() { fmt.Println(\"hi\") }\r\n\n  x := 1_000_000",
	"   leading and trailing spaces   ",
	"zero\u200bwidth\u00a0nbsp\ufeffbom",
	"\x00\x01\x7f control",
}

func TestO200kRoundTripsUnicode(t *testing.T) {
	tok := o200kT(t)
	for _, s := range unicodeTexts {
		ids := tok.Encode(s)
		if got := tok.Decode(ids); got != s {
			t.Errorf("round trip of %q gave %q (ids %v)", s, got, ids)
		}
	}
	all := strings.Join(unicodeTexts, "\n")
	if got := tok.Decode(tok.Encode(all)); got != all {
		t.Error("round trip of all texts joined differs")
	}
}

func TestO200kSplitsMultiByteCharactersAcrossIDs(t *testing.T) {
	tok := o200kT(t)
	// 👋 is not one token: its 4 bytes are spread over two ids, neither of
	// which is valid UTF-8 alone; together they are.
	ids := tok.Encode("hello 👋")
	var split bool
	for _, id := range ids {
		if !utf8.ValidString(tok.Decode([]uint32{id})) {
			split = true
		}
	}
	if !split {
		t.Fatalf("ids %v: no id holds a partial character; the test needs one", ids)
	}
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(tok.Decode([]uint32{id})) // bytes as they are
	}
	if b.String() != "hello 👋" {
		t.Errorf("ids decoded one by one concatenate to %q", b.String())
	}
}

func TestO200kInvalidUTF8EncodesAsReplacement(t *testing.T) {
	tok := o200kT(t)
	s := "a\xffb\xc3"
	want := string([]rune(s)) // each invalid byte read as U+FFFD
	if got := tok.Decode(tok.Encode(s)); got != want {
		t.Errorf("round trip of %q = %q, want %q", s, got, want)
	}
}

func FuzzO200kRoundTrip(f *testing.F) {
	tok := o200kT(f)
	for _, s := range unicodeTexts {
		f.Add(s)
	}
	f.Add("<|endoftext|>")
	f.Add("a\xffb")
	f.Fuzz(func(t *testing.T, s string) {
		want := s
		if !utf8.ValidString(s) {
			want = string([]rune(s))
		}
		ids := tok.Encode(s)
		if got := tok.Decode(ids); got != want {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
		for _, id := range ids {
			if int(id) >= 199998 {
				t.Fatalf("Encode(%q) gave id %d, not a mergeable rank", s, id)
			}
		}
	})
}

func BenchmarkO200kEncode(b *testing.B) {
	tok := o200kT(b)
	text := strings.Repeat(strings.Join(unicodeTexts, "\n"), 4)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text)
	}
}
