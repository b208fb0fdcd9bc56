package replay

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvstrata/kvstrata/trace"
)

func TestPromptsShareExactlyThePrefixTheirHashIDsShare(t *testing.T) {
	p := Prompts{Vocab: DefaultVocab, Seed: 7}
	a := trace.Request{InputLength: 3*512 + 100, OutputLength: 1, HashIDs: []uint64{0, 1, 2, 3}}
	b := trace.Request{InputLength: 4 * 512, OutputLength: 1, HashIDs: []uint64{0, 1, 9, 3}}
	pa, err := p.Tokens(a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := p.Tokens(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(pa) != int(a.InputLength) || len(pb) != int(b.InputLength) {
		t.Fatalf("prompts of %d and %d tokens, want exactly input_length: %d and %d", len(pa), len(pb), a.InputLength, b.InputLength)
	}
	// The first k = 2 hash ids are the same: the first 2·512 tokens are.
	if !slices.Equal(pa[:2*512], pb[:2*512]) {
		t.Error("the prompts differ within the 2 blocks their hash ids share")
	}
	// Block 3 differs (2 vs 9): so do its tokens, and the same id 3 after
	// a different prefix still gives the same tokens (the trace's ids
	// name the chain, the prompt only follows them).
	if slices.Equal(pa[2*512:3*512], pb[2*512:3*512]) {
		t.Error("blocks with different hash ids have the same tokens")
	}
	if !slices.Equal(pa[3*512:], pb[3*512:3*512+100]) {
		t.Error("the last, cut block is not the start of its hash id's tokens")
	}
	for _, id := range append(pa, pb...) {
		if int(id) >= DefaultVocab {
			t.Fatalf("token id %d outside the vocabulary of %d", id, DefaultVocab)
		}
	}
}

func TestPromptsAreTheSameEveryTimeAndChangeWithTheSeed(t *testing.T) {
	r := trace.Request{InputLength: 600, OutputLength: 1, HashIDs: []uint64{42, 43}}
	first, _ := Prompts{Vocab: 1000, Seed: 1}.Tokens(r)
	again, _ := Prompts{Vocab: 1000, Seed: 1}.Tokens(r)
	other, _ := Prompts{Vocab: 1000, Seed: 2}.Tokens(r)
	if !slices.Equal(first, again) {
		t.Error("the same request and seed gave two prompts")
	}
	if slices.Equal(first, other) {
		t.Error("another seed gave the same prompt")
	}
}

func TestPromptsRefuseRequestsThatCannotBeMade(t *testing.T) {
	p := Prompts{Vocab: DefaultVocab}
	for _, r := range []trace.Request{
		{InputLength: 0, OutputLength: 1, HashIDs: []uint64{1}},
		{InputLength: 513, OutputLength: 1, HashIDs: []uint64{1}},
		{InputLength: 10, OutputLength: 0, HashIDs: []uint64{1}},
	} {
		if _, err := p.Tokens(r); !errors.Is(err, ErrPrompt) {
			t.Errorf("%+v: error %v, want ErrPrompt", r, err)
		}
	}
}
