package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrMalformed marks a payload that is not a vLLM event batch: every error
// Decode returns wraps it, and says where in the payload it went wrong.
var ErrMalformed = errors.New("kvevents: malformed event batch")

// Decode reads the msgpack payload of one vLLM event message, in either
// encoding, and each event in either of its forms: a tagged array or a map
// with a "type" key. The batch may be an array [ts, events] or [ts, events,
// data_parallel_rank], or a map with those keys. What vLLM may add and this
// package does not know is skipped: trailing array elements and unknown
// map keys. An unknown event class, a missing or mistyped field, trailing
// bytes or a truncated payload is an error wrapping ErrMalformed.
func Decode(payload []byte) (*Batch, error) {
	r := bytes.NewReader(payload)
	d := &decoder{d: msgpack.NewDecoder(r), r: r}
	b, err := d.batch()
	if err == nil && r.Len() > 0 {
		err = fmt.Errorf("%d bytes after the batch", r.Len())
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return b, nil
}

type decoder struct {
	d *msgpack.Decoder
	r *bytes.Reader // what d reads: the rest of the payload
}

// kind is what the next value is: 'a'rray, 'm'ap, 'n'il or 0 for another.
func (d *decoder) kind() (byte, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, truncated(err)
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		return 'a', nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		return 'm', nil
	case c == msgpcode.Nil:
		return 'n', nil
	}
	return 0, nil
}

func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("payload ends too early")
	}
	return err
}

func (d *decoder) batch() (*Batch, error) {
	k, err := d.kind()
	if err != nil {
		return nil, err
	}
	b := &Batch{}
	switch k {
	case 'a':
		n, err := d.d.DecodeArrayLen()
		if err != nil {
			return nil, truncated(err)
		}
		if n < 2 {
			return nil, fmt.Errorf("batch: array of %d elements, want [ts, events] or [ts, events, data_parallel_rank]", n)
		}
		if b.TS, err = d.float("batch ts"); err != nil {
			return nil, err
		}
		if b.Events, err = d.events(); err != nil {
			return nil, err
		}
		if n >= 3 {
			if b.DataParallelRank, err = d.optInt("batch data_parallel_rank"); err != nil {
				return nil, err
			}
		}
		return b, d.skip(n-3, "batch")
	case 'm':
		var haveTS, haveEvents bool
		err := d.fields("batch", func(key string) error {
			var err error
			switch key {
			case "ts":
				haveTS = true
				b.TS, err = d.float("batch ts")
			case "events":
				haveEvents = true
				b.Events, err = d.events()
			case "data_parallel_rank":
				b.DataParallelRank, err = d.optInt("batch data_parallel_rank")
			default:
				err = d.skip(1, "batch "+key)
			}
			return err
		})
		if err == nil && (!haveTS || !haveEvents) {
			err = errors.New("batch: map without ts or events")
		}
		return b, err
	}
	return nil, errors.New("batch: neither an array nor a map")
}

// fields reads a map with string keys, calling field for each key with
// the decoder at its value, which field must consume.
func (d *decoder) fields(what string, field func(key string) error) error {
	n, err := d.d.DecodeMapLen()
	if err != nil {
		return fmt.Errorf("%s: %w", what, truncated(err))
	}
	for range n {
		key, err := d.str("key")
		if err != nil {
			return fmt.Errorf("%s %w", what, err) // "event key: …"
		}
		if err := field(key); err != nil {
			return err
		}
	}
	return nil
}

// skip skips n values (none if n <= 0). It walks nested arrays and maps
// itself, without recursion (msgpack's Skip recurses once per level, so
// deeply nested garbage could exhaust the stack); every value it counts
// takes a byte at least, so it ends with the payload.
func (d *decoder) skip(n int, what string) error {
	for pending := int64(n); pending > 0; pending-- {
		k, err := d.kind()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		var m int
		switch k {
		case 'a':
			m, err = d.d.DecodeArrayLen()
			pending += int64(m)
		case 'm':
			m, err = d.d.DecodeMapLen()
			pending += 2 * int64(m)
		default:
			err = d.d.Skip()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, truncated(err))
		}
	}
	return nil
}

// arrayLen reads an array's length, and refuses one the rest of the
// payload cannot hold (every element takes a byte at least), so that a
// forged length allocates nothing.
func (d *decoder) arrayLen(what string) (int, error) {
	k, err := d.kind()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if k != 'a' {
		return 0, fmt.Errorf("%s: not an array", what)
	}
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, truncated(err))
	}
	if n > d.r.Len() {
		return 0, fmt.Errorf("%s: array of %d elements, longer than the payload", what, n)
	}
	return n, nil
}

func (d *decoder) events() ([]Event, error) {
	n, err := d.arrayLen("batch events")
	if err != nil {
		return nil, err
	}
	evs := make([]Event, 0, n)
	for i := range n {
		ev, err := d.event()
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

func (d *decoder) event() (Event, error) {
	k, err := d.kind()
	if err != nil {
		return nil, err
	}
	switch k {
	case 'a':
		return d.arrayEvent()
	case 'm':
		return d.mapEvent()
	}
	return nil, errors.New("neither a tagged array nor a map")
}

func (d *decoder) arrayEvent() (Event, error) {
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return nil, truncated(err)
	}
	if n < 1 {
		return nil, errors.New("empty array, want a tag first")
	}
	tag, err := d.str("tag")
	if err != nil {
		return nil, err
	}
	n--               // the fields after the tag
	var want, opt int // fields required, and optional ones after them
	var ev Event
	switch tag {
	case TagBlockStored:
		s := &BlockStored{}
		ev, want, opt = s, 4, 2
		if n >= want {
			err = d.blockStoredFields(s, min(n, want+opt))
		}
	case TagBlockRemoved:
		r := &BlockRemoved{}
		ev, want, opt = r, 1, 1
		if n >= want {
			err = d.blockRemovedFields(r, min(n, want+opt))
		}
	case TagAllBlocksCleared:
		ev = &AllBlocksCleared{}
	default:
		return nil, fmt.Errorf("unknown event tag %q", tag)
	}
	if n < want {
		return nil, fmt.Errorf("%s: array of %d fields, want %d at least", tag, n, want)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tag, err)
	}
	return ev, d.skip(n-want-opt, tag)
}

// blockStoredFields reads the first n fields of a BlockStored, in order.
func (d *decoder) blockStoredFields(s *BlockStored, n int) error {
	var err error
	for i := 0; i < n && err == nil; i++ {
		switch i {
		case 0:
			s.BlockHashes, err = d.hashes("block_hashes")
		case 1:
			s.ParentBlockHash, err = d.optHash("parent_block_hash")
		case 2:
			s.TokenIDs, err = d.ints("token_ids")
		case 3:
			s.BlockSize, err = d.int("block_size")
		case 4:
			s.LoraID, err = d.optInt("lora_id")
		case 5:
			s.Medium, err = d.optStr("medium")
		}
	}
	return err
}

func (d *decoder) blockRemovedFields(r *BlockRemoved, n int) error {
	var err error
	if n >= 1 {
		r.BlockHashes, err = d.hashes("block_hashes")
	}
	if n >= 2 && err == nil {
		r.Medium, err = d.optStr("medium")
	}
	return err
}

func (d *decoder) mapEvent() (Event, error) {
	// Read the fields into every event kind's slots, then keep the one the
	// "type" names: the tag need not come first.
	var (
		s      BlockStored
		tag    string
		hashes []Hash
		medium *string
		seen   = map[string]bool{}
	)
	err := d.fields("event", func(key string) error {
		if seen[key] {
			return fmt.Errorf("event: key %q twice", key)
		}
		seen[key] = true
		var err error
		switch key {
		case "type":
			tag, err = d.str("type")
		case "block_hashes":
			hashes, err = d.hashes("block_hashes")
		case "parent_block_hash":
			s.ParentBlockHash, err = d.optHash("parent_block_hash")
		case "token_ids":
			s.TokenIDs, err = d.ints("token_ids")
		case "block_size":
			s.BlockSize, err = d.int("block_size")
		case "lora_id":
			s.LoraID, err = d.optInt("lora_id")
		case "medium":
			medium, err = d.optStr("medium")
		default:
			err = d.skip(1, "event "+key)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if !seen["type"] {
		return nil, errors.New(`map without a "type" key`)
	}
	switch tag {
	case TagBlockStored:
		if !seen["block_hashes"] || !seen["parent_block_hash"] || !seen["token_ids"] || !seen["block_size"] {
			return nil, errors.New("BlockStored: map without block_hashes, parent_block_hash, token_ids or block_size")
		}
		s.BlockHashes, s.Medium = hashes, medium
		return &s, nil
	case TagBlockRemoved:
		if !seen["block_hashes"] {
			return nil, errors.New("BlockRemoved: map without block_hashes")
		}
		return &BlockRemoved{BlockHashes: hashes, Medium: medium}, nil
	case TagAllBlocksCleared:
		return &AllBlocksCleared{}, nil
	}
	return nil, fmt.Errorf("unknown event type %q", tag)
}

func (d *decoder) str(what string) (string, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, truncated(err))
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("%s: not a string", what)
	}
	s, err := d.d.DecodeString()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, truncated(err))
	}
	return s, nil
}

func (d *decoder) optStr(what string) (*string, error) {
	if k, err := d.kind(); err != nil || k == 'n' {
		return nil, d.nilOr(what, err)
	}
	s, err := d.str(what)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// nilOr consumes a nil, or returns err (about what).
func (d *decoder) nilOr(what string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return d.d.DecodeNil()
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || c >= msgpcode.Uint8 && c <= msgpcode.Int64
}

// int reads an integer that fits an int64.
func (d *decoder) int(what string) (int64, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, truncated(err))
	}
	if !isInt(c) {
		return 0, fmt.Errorf("%s: not an integer", what)
	}
	if c == msgpcode.Uint64 {
		u, err := d.d.DecodeUint64()
		if err == nil && u > math.MaxInt64 {
			err = fmt.Errorf("%d does not fit an int64", u)
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, truncated(err))
		}
		return int64(u), nil
	}
	v, err := d.d.DecodeInt64()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, truncated(err))
	}
	return v, nil
}

func (d *decoder) optInt(what string) (*int64, error) {
	if k, err := d.kind(); err != nil || k == 'n' {
		return nil, d.nilOr(what, err)
	}
	v, err := d.int(what)
	if err != nil {
		return nil, err
	}
	return &v, nil
}

func (d *decoder) ints(what string) ([]int64, error) {
	n, err := d.arrayLen(what)
	if err != nil {
		return nil, err
	}
	vs := make([]int64, 0, n)
	for i := range n {
		v, err := d.int(what)
		if err != nil { // named here, not before: a label per element costs more than the element
			return nil, fmt.Errorf("element %d of %w", i, err)
		}
		vs = append(vs, v)
	}
	return vs, nil
}

func (d *decoder) float(what string) (float64, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, truncated(err))
	}
	if c != msgpcode.Float && c != msgpcode.Double && !isInt(c) {
		return 0, fmt.Errorf("%s: not a number", what)
	}
	v, err := d.d.DecodeFloat64()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, truncated(err))
	}
	return v, nil
}

func (d *decoder) hash(what string) (Hash, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return Hash{}, fmt.Errorf("%s: %w", what, truncated(err))
	}
	switch {
	case msgpcode.IsBin(c):
		// Not DecodeBytes: it allocates whatever length the payload
		// claims before reading it.
		n, err := d.d.DecodeBytesLen()
		if err != nil {
			return Hash{}, fmt.Errorf("%s: %w", what, truncated(err))
		}
		if n > d.r.Len() {
			return Hash{}, fmt.Errorf("%s: %d bytes, longer than the payload", what, n)
		}
		b := make([]byte, n)
		if err := d.d.ReadFull(b); err != nil {
			return Hash{}, fmt.Errorf("%s: %w", what, truncated(err))
		}
		return BytesHash(b), nil
	case c == msgpcode.Uint64:
		u, err := d.d.DecodeUint64()
		if err != nil {
			return Hash{}, fmt.Errorf("%s: %w", what, truncated(err))
		}
		return UintHash(u), nil
	case isInt(c):
		v, err := d.d.DecodeInt64()
		if err != nil {
			return Hash{}, fmt.Errorf("%s: %w", what, truncated(err))
		}
		return IntHash(v), nil
	}
	return Hash{}, fmt.Errorf("%s: neither an integer nor bytes", what)
}

func (d *decoder) optHash(what string) (*Hash, error) {
	if k, err := d.kind(); err != nil || k == 'n' {
		return nil, d.nilOr(what, err)
	}
	h, err := d.hash(what)
	if err != nil {
		return nil, err
	}
	return &h, nil
}

func (d *decoder) hashes(what string) ([]Hash, error) {
	n, err := d.arrayLen(what)
	if err != nil {
		return nil, err
	}
	hs := make([]Hash, 0, n)
	for i := range n {
		h, err := d.hash(what)
		if err != nil {
			return nil, fmt.Errorf("element %d of %w", i, err)
		}
		hs = append(hs, h)
	}
	return hs, nil
}
