package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrFrame marks a ZeroMQ message that does not have the shape of vLLM's
// event messages.
var ErrFrame = errors.New("kvevents: bad message frames")

// EndSeq is the sequence number that ends an answer to a replay request
// (its payload is empty).
const EndSeq int64 = -1

// Frames is one published message as vLLM's ZmqEventPublisher sends it on
// its PUB socket: three frames, the topic (UTF-8, may be empty), the
// sequence number as 8 bytes big-endian, and the payload (Encode's).
// Sequence numbers count from 0, one per batch.
func Frames(topic string, seq int64, payload []byte) [][]byte {
	return [][]byte{[]byte(topic), SeqBytes(seq), payload}
}

// ParseFrames reads a message that Frames made.
func ParseFrames(frames [][]byte) (topic string, seq int64, payload []byte, err error) {
	if len(frames) != 3 {
		return "", 0, nil, fmt.Errorf("%w: %d frames, want 3 (topic, sequence, payload)", ErrFrame, len(frames))
	}
	seq, err = ParseSeq(frames[1])
	if err != nil {
		return "", 0, nil, err
	}
	return string(frames[0]), seq, frames[2], nil
}

// SeqBytes is seq as 8 bytes big-endian (two's complement for EndSeq).
func SeqBytes(seq int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(seq))
}

// ParseSeq reads a sequence number that SeqBytes wrote.
func ParseSeq(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: sequence number of %d bytes, want 8", ErrFrame, len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// The replay socket is a ROUTER. A subscriber that missed batches (a gap
// in the sequence numbers) sends it, from a REQ or DEALER socket, the
// first sequence number it wants: ReplayRequest's frame (a DEALER puts an
// empty delimiter frame before it, as REQ does by itself). The publisher
// answers with one message per buffered batch from there on,
// ReplayReply(seq, payload), then ReplayReply(EndSeq, nil); a ROUTER
// prefixes each with the requester's identity and the empty delimiter.

// ReplayRequest is the frame a subscriber sends to ask for every buffered
// batch from sequence number start on.
func ReplayRequest(start int64) [][]byte {
	return [][]byte{SeqBytes(start)}
}

// ParseReplayRequest reads the frames a ROUTER receives from a replay
// client — identity, empty delimiter, start sequence number — and returns
// the identity and the start.
func ParseReplayRequest(frames [][]byte) (identity []byte, start int64, err error) {
	if len(frames) != 3 || len(frames[1]) != 0 {
		return nil, 0, fmt.Errorf("%w: replay request of %d frames, want 3 (identity, empty, start)", ErrFrame, len(frames))
	}
	start, err = ParseSeq(frames[2])
	return frames[0], start, err
}

// ReplayReply is one message of the answer to a replay request, as the
// requester receives it: the batch's sequence number and its payload, or
// EndSeq and an empty payload to end the answer.
func ReplayReply(seq int64, payload []byte) [][]byte {
	if payload == nil {
		payload = []byte{}
	}
	return [][]byte{SeqBytes(seq), payload}
}

// ParseReplayReply reads a message that ReplayReply made; end is true for
// the one that ends the answer.
func ParseReplayReply(frames [][]byte) (seq int64, payload []byte, end bool, err error) {
	if len(frames) != 2 {
		return 0, nil, false, fmt.Errorf("%w: replay reply of %d frames, want 2 (sequence, payload)", ErrFrame, len(frames))
	}
	seq, err = ParseSeq(frames[0])
	if err != nil {
		return 0, nil, false, err
	}
	return seq, frames[1], seq == EndSeq, nil
}
