package kvevents

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding is one of vLLM's two ways of writing an event.
type Encoding int

const (
	// TaggedArrays writes each event as an array whose first element is
	// its class name, then its fields in declaration order:
	//
	//	["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
	//	["BlockRemoved", block_hashes, medium]
	//	["AllBlocksCleared"]
	//
	// as vLLM's msgspec structs declared with array_like=True, tag=True do.
	// It is the default.
	TaggedArrays Encoding = iota
	// Maps writes each event as a map whose "type" key, first, names its
	// class, then one key per field (absent values as nil), as newer vLLM
	// (tag=True without array_like) does.
	Maps
)

func (e Encoding) String() string {
	switch e {
	case TaggedArrays:
		return "arrays"
	case Maps:
		return "maps"
	}
	return fmt.Sprintf("Encoding(%d)", int(e))
}

// ParseEncoding reads an encoding's name: "arrays" or "maps".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "arrays":
		return TaggedArrays, nil
	case "maps":
		return Maps, nil
	}
	return 0, fmt.Errorf("kvevents: unknown encoding %q (want arrays or maps)", s)
}

// Encode writes b as the msgpack payload of one vLLM event message. The
// batch itself is the array [ts, events, data_parallel_rank], in both
// encodings, the rank nil when b.DataParallelRank is (as vLLM's msgspec
// array_like batch writes its None default; Dynamo's relay requires the
// three elements); enc chooses
// how each event is written. It fails on an event it does not know (nil
// included) and on an unknown encoding.
func Encode(b *Batch, enc Encoding) ([]byte, error) {
	if enc != TaggedArrays && enc != Maps {
		return nil, fmt.Errorf("kvevents: encode: unknown %v", enc)
	}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	err := e.EncodeArrayLen(3)
	err = join(err, e.EncodeFloat64(b.TS))
	err = join(err, e.EncodeArrayLen(len(b.Events)))
	for i, ev := range b.Events {
		if err != nil {
			break
		}
		if err = encodeEvent(e, ev, enc); err != nil {
			err = fmt.Errorf("kvevents: encode event %d: %w", i, err)
		}
	}
	if b.DataParallelRank != nil {
		err = join(err, e.EncodeInt(*b.DataParallelRank))
	} else {
		err = join(err, e.EncodeNil())
	}
	if err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// join keeps the first error of a sequence of writes.
func join(first, next error) error {
	if first != nil {
		return first
	}
	return next
}

func encodeEvent(e *msgpack.Encoder, ev Event, enc Encoding) error {
	// fields lists an event's fields in declaration order.
	type field struct {
		name  string
		write func() error
	}
	var fields []field
	switch ev := ev.(type) {
	case *BlockStored:
		if ev == nil {
			return fmt.Errorf("nil %s", TagBlockStored)
		}
		fields = []field{
			{"block_hashes", func() error { return encodeHashes(e, ev.BlockHashes) }},
			{"parent_block_hash", func() error {
				if ev.ParentBlockHash == nil {
					return e.EncodeNil()
				}
				return encodeHash(e, *ev.ParentBlockHash)
			}},
			{"token_ids", func() error {
				err := e.EncodeArrayLen(len(ev.TokenIDs))
				for _, t := range ev.TokenIDs {
					err = join(err, e.EncodeInt(t))
				}
				return err
			}},
			{"block_size", func() error { return e.EncodeInt(ev.BlockSize) }},
			{"lora_id", func() error { return encodeOptInt(e, ev.LoraID) }},
			{"medium", func() error { return encodeOptString(e, ev.Medium) }},
		}
	case *BlockRemoved:
		if ev == nil {
			return fmt.Errorf("nil %s", TagBlockRemoved)
		}
		fields = []field{
			{"block_hashes", func() error { return encodeHashes(e, ev.BlockHashes) }},
			{"medium", func() error { return encodeOptString(e, ev.Medium) }},
		}
	case *AllBlocksCleared:
		if ev == nil {
			return fmt.Errorf("nil %s", TagAllBlocksCleared)
		}
	default:
		return fmt.Errorf("unknown event %T", ev)
	}
	var err error
	if enc == TaggedArrays {
		err = e.EncodeArrayLen(1 + len(fields))
	} else {
		err = join(e.EncodeMapLen(1+len(fields)), e.EncodeString("type"))
	}
	err = join(err, e.EncodeString(ev.Tag()))
	for _, f := range fields {
		if enc == Maps {
			err = join(err, e.EncodeString(f.name))
		}
		err = join(err, f.write())
	}
	return err
}

func encodeHashes(e *msgpack.Encoder, hs []Hash) error {
	err := e.EncodeArrayLen(len(hs))
	for _, h := range hs {
		err = join(err, encodeHash(e, h))
	}
	return err
}

func encodeHash(e *msgpack.Encoder, h Hash) error {
	switch {
	case h.isB:
		return e.EncodeBytes(h.b)
	case h.neg:
		return e.EncodeInt(int64(h.n))
	}
	return e.EncodeUint(h.n)
}

func encodeOptInt(e *msgpack.Encoder, v *int64) error {
	if v == nil {
		return e.EncodeNil()
	}
	return e.EncodeInt(*v)
}

func encodeOptString(e *msgpack.Encoder, v *string) error {
	if v == nil {
		return e.EncodeNil()
	}
	return e.EncodeString(*v)
}
