package client

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/transfer"
)

// Errors a caller can test for with errors.Is.
var (
	ErrNotFound = errors.New("kvstrata: not found")
	// ErrInvalid marks a request the node refused as malformed or over a
	// limit; retrying it unchanged fails again.
	ErrInvalid = errors.New("kvstrata: invalid request")
	// ErrFull marks a block the node had no room for (everything evictable
	// was pinned).
	ErrFull = errors.New("kvstrata: node full")
	// ErrUnavailable marks a node that could not be reached, is shutting
	// down or restarting, or is at its connection limit; the client retried
	// for Options.RetryBudget before returning it.
	ErrUnavailable = errors.New("kvstrata: node unavailable")
	// ErrPinned marks an eviction of a block under a lease.
	ErrPinned = errors.New("kvstrata: block pinned")
	// ErrCorrupt marks bytes that failed their checksum on the way.
	ErrCorrupt = errors.New("kvstrata: block corrupt")
	// ErrUnauthenticated marks a call the node refused because the client
	// gave no token, or one the node does not know (Options.Token).
	ErrUnauthenticated = errors.New("kvstrata: the node wants a valid token (--token, KVSTRATA_TOKEN or --token-file)")
	// ErrDenied marks a call the client's identity lacks the role for.
	ErrDenied = errors.New("kvstrata: permission denied")
)

// Error is an error reported by a node: the gRPC code and the node's message.
// It matches the sentinel of its code (ErrInvalid for InvalidArgument, …).
type Error struct {
	Op   string // the call: "put", "get", …
	Code codes.Code
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("kvstrata: %s: %v: %s", e.Op, e.Code, e.Msg) }

func (e *Error) Is(target error) bool {
	switch e.Code {
	case codes.NotFound:
		return target == ErrNotFound
	case codes.InvalidArgument, codes.OutOfRange:
		return target == ErrInvalid
	case codes.ResourceExhausted:
		return target == ErrFull
	case codes.Unavailable:
		return target == ErrUnavailable
	case codes.FailedPrecondition:
		return target == ErrPinned
	case codes.DataLoss:
		return target == ErrCorrupt
	case codes.Unauthenticated:
		return target == ErrUnauthenticated
	case codes.PermissionDenied:
		return target == ErrDenied
	case codes.DeadlineExceeded:
		return target == context.DeadlineExceeded
	case codes.Canceled:
		return target == context.Canceled
	}
	return false
}

// wrap turns a gRPC or data-plane error into an *Error.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		return err
	}
	if s, ok := status.FromError(err); ok {
		return &Error{Op: op, Code: s.Code(), Msg: s.Message()}
	}
	code := codes.Unknown
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, transfer.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, transfer.ErrCorrupt):
		code = codes.DataLoss
	case errors.Is(err, transfer.ErrRefused):
		code = codes.InvalidArgument
	case errors.Is(err, transfer.ErrFull):
		code = codes.ResourceExhausted
	case errors.Is(err, transfer.ErrClosed), errors.Is(err, transfer.ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, transfer.ErrUnauthenticated):
		code = codes.Unauthenticated
	}
	return &Error{Op: op, Code: code, Msg: err.Error()}
}

// transient reports whether a failed call may succeed if tried again.
func transient(err error) bool {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Code == codes.Unavailable || ce.Code == codes.Aborted
	}
	return false
}

// BatchError reports the blocks of a put that failed; the others were stored.
type BatchError struct {
	Errs []error // one per block of the call, nil where it succeeded
}

func (e *BatchError) Error() string {
	n, first := 0, error(nil)
	for _, err := range e.Errs {
		if err != nil {
			if n++; first == nil {
				first = err
			}
		}
	}
	return fmt.Sprintf("kvstrata: put: %d of %d blocks failed, first: %v", n, len(e.Errs), first)
}

// Unwrap lets errors.Is find the failures' sentinels.
func (e *BatchError) Unwrap() []error { return e.Errs }
