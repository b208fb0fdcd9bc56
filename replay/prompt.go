package replay

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/kvstrata/kvstrata/trace"
)

// BlockTokens is the block size of the Mooncake traces: each hash id names
// 512 tokens.
const BlockTokens = 512

// DefaultVocab is the number of ids prompts draw from by default: o200k's
// mergeable ranks 0…199997, leaving out its special tokens (199999 and
// 200018), so that a drawn id never ends or delimits a prompt.
const DefaultVocab = 199998

// ErrPrompt marks a trace request no prompt can be made for (no input, or
// fewer hash ids than its input needs); test with errors.Is.
var ErrPrompt = errors.New("replay: bad request in trace")

// Prompts makes token-id prompts from a trace's hash ids. Every hash id
// expands to BlockTokens ids drawn from a generator seeded by (Seed, id),
// so the same hash id is always the same tokens and two requests share
// exactly the prefix their hash ids share; the last block is cut so the
// prompt has exactly input_length tokens. The zero value is not usable:
// Vocab must be ≥ 1. A Prompts is safe for concurrent use.
type Prompts struct {
	Vocab int    // ids are in [0, Vocab); DefaultVocab for o200k
	Seed  uint64 // another seed, other tokens for the same ids
}

// Check reports whether a prompt can be made for r, as an error matching
// ErrPrompt.
func (p Prompts) Check(r trace.Request) error {
	switch {
	case r.InputLength < 1:
		return fmt.Errorf("%w: input_length is %d, a prompt needs at least one token", ErrPrompt, r.InputLength)
	case r.Blocks(BlockTokens) > int64(len(r.HashIDs)):
		return fmt.Errorf("%w: input_length %d needs %d hash ids of %d tokens, the request has %d",
			ErrPrompt, r.InputLength, r.Blocks(BlockTokens), BlockTokens, len(r.HashIDs))
	case r.OutputLength < 1:
		return fmt.Errorf("%w: output_length is %d, want at least one token", ErrPrompt, r.OutputLength)
	}
	return nil
}

// Tokens returns r's prompt: InputLength ids. Hash ids beyond those the
// input needs are ignored.
func (p Prompts) Tokens(r trace.Request) ([]uint32, error) {
	if p.Vocab < 1 {
		return nil, fmt.Errorf("replay: vocabulary of %d ids", p.Vocab)
	}
	if err := p.Check(r); err != nil {
		return nil, err
	}
	ids := make([]uint32, 0, r.InputLength)
	for _, h := range r.HashIDs {
		n := min(BlockTokens, int(r.InputLength)-len(ids))
		if n <= 0 {
			break
		}
		ids = p.appendBlock(ids, h, n)
	}
	return ids, nil
}

// appendBlock appends the first n ids of hash id h's block.
func (p Prompts) appendBlock(ids []uint32, h uint64, n int) []uint32 {
	rng := rand.New(rand.NewPCG(p.Seed, h))
	for range n {
		ids = append(ids, uint32(rng.IntN(p.Vocab)))
	}
	return ids
}
