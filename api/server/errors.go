package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// Code maps an error of the node, its tiers or the index to the gRPC code a
// client can act on.
func Code(err error) codes.Code {
	switch {
	case err == nil:
		return codes.OK
	case errors.Is(err, node.ErrLimit), errors.Is(err, tiers.ErrTooLarge), errors.Is(err, tiers.ErrInvalid),
		errors.Is(err, node.ErrChecksum), errors.Is(err, index.ErrInvalidNamespace):
		return codes.InvalidArgument
	case errors.Is(err, tiers.ErrNotFound), errors.Is(err, node.ErrUnknownLease):
		return codes.NotFound
	case errors.Is(err, tiers.ErrFull), errors.Is(err, tiers.ErrNoSpace), errors.Is(err, tiers.ErrQuota):
		return codes.ResourceExhausted
	case errors.Is(err, tiers.ErrPinned):
		return codes.FailedPrecondition
	case errors.Is(err, tiers.ErrClosed), errors.Is(err, tiers.ErrBusy), errors.Is(err, tiers.ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Internal
}

// toStatus turns err into a gRPC status error with err's message.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(Code(err), err.Error())
}
