// Package tokenizer turns text into a model's token ids and back.
package tokenizer

// Tokenizer is a model's tokenizer.
type Tokenizer interface {
	// Encode is text's token ids.
	Encode(text string) []uint32
	// Decode is the text of ids. Ids the vocabulary lacks decode to
	// nothing; a multi-byte character split across ids decodes to its
	// bytes as they are (callers streaming text hold back an incomplete
	// UTF-8 tail until the next ids complete it).
	Decode(ids []uint32) string
	// VocabSize is the number of token ids, special tokens included.
	VocabSize() int
}
