package frame

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// Status is the outcome a frame carries: a hello's, a response's, a
// block's or a put result's.
type Status uint8

// The statuses of protocol version 1.
const (
	StatusOK       Status = iota
	StatusNotFound        // the block is not stored (transfer.ErrNotFound)
	StatusCorrupt         // the bytes failed their checksum (transfer.ErrCorrupt)
	StatusRefused         // refused as a whole, or one block the handler refused; msg says why (transfer.ErrRefused)
	StatusError           // msg holds the server's error (transfer.ErrRemote)
	StatusFull            // the handler had no room for the block (transfer.ErrFull)
	// StatusUnavailable: the server cannot serve this now, and may soon;
	// msg says why (transfer.ErrUnavailable). For a block: it is held but
	// out of reach, as in an object store that is down. In a server hello:
	// the server serves its limit of connections.
	StatusUnavailable
	numStatus
)

// StatusUnauthenticated is a status of server hellos only (no block or
// result carries it, and Known says false): the node authenticates its
// clients, and the client's hello carried no valid credential
// (transfer.ErrUnauthenticated); the server closes the connection after it.
const StatusUnauthenticated = numStatus

// Known says whether st is a status of the protocol; any other is a
// protocol violation.
func (st Status) Known() bool { return st < numStatus }

// StatusOf maps a Handler's error to the status that carries it.
func StatusOf(err error) Status {
	switch {
	case err == nil:
		return StatusOK
	case errors.Is(err, transfer.ErrNotFound):
		return StatusNotFound
	case errors.Is(err, transfer.ErrCorrupt):
		return StatusCorrupt
	case errors.Is(err, transfer.ErrFull):
		return StatusFull
	case errors.Is(err, transfer.ErrUnavailable):
		return StatusUnavailable
	case errors.Is(err, transfer.ErrRefused):
		return StatusRefused
	}
	return StatusError
}

// ReserveStatus maps the error of a Handler's Reserve (not nil) to the
// status of the block's put result: StatusOf's, except that a put result
// is never OK, NotFound nor Unavailable, which become StatusError.
func ReserveStatus(err error) Status {
	st := StatusOf(err)
	if st == StatusOK || st == StatusNotFound || st == StatusUnavailable {
		st = StatusError
	}
	return st
}

// Message returns the msg that goes on the wire with st for err: at most
// MaxMsg bytes of valid UTF-8; none for statuses that say it all.
func Message(st Status, err error) string {
	if err == nil || st == StatusNotFound {
		return ""
	}
	return Clip(err.Error())
}

// Clip returns s as valid UTF-8 of at most MaxMsg bytes: invalid bytes
// become '?', and a rune cut by the limit is dropped whole.
func Clip(s string) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= MaxMsg {
		return s
	}
	s = s[:MaxMsg]
	for len(s) > 0 {
		if r, n := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || n != 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// BlockError is the error a Conn reports for block i (key k) that the
// server at addr answered with st (not OK) and msg. backend names the
// transport ("tcp", "ucx") at the start of the message. The error wraps
// transfer.ErrNotFound, ErrCorrupt, ErrFull, ErrRefused or ErrUnavailable
// for those statuses, and transfer.ErrRemote for any other.
func BlockError(backend, addr string, i int, k index.Key, st Status, msg []byte) error {
	switch st {
	case StatusNotFound:
		return transfer.ErrNotFound
	case StatusCorrupt:
		if len(msg) == 0 {
			return fmt.Errorf("%s: block %d (%v) at %s: %w", backend, i, k, addr, transfer.ErrCorrupt)
		}
		return fmt.Errorf("%s: block %d (%v) at %s: %s: %w", backend, i, k, addr, msg, transfer.ErrCorrupt)
	case StatusFull:
		return fmt.Errorf("%s: block %d (%v) at %s: %s: %w", backend, i, k, addr, msg, transfer.ErrFull)
	case StatusUnavailable:
		return fmt.Errorf("%s: block %d (%v) at %s: %s: %w", backend, i, k, addr, msg, transfer.ErrUnavailable)
	case StatusRefused:
		return fmt.Errorf("%s: block %d (%v) at %s: %s: %w", backend, i, k, addr, msg, transfer.ErrRefused)
	}
	return fmt.Errorf("%s: block %d (%v) at %s: %s: %w", backend, i, k, addr, msg, transfer.ErrRemote)
}
