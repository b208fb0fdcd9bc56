package node

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/transfer"
)

// DataObserver is told about each block the data plane moved: its
// direction ("in" for puts, "out" for gets), its size and when the
// transfer of it started.
type DataObserver func(direction string, bytes int, start time.Time)

// DataHandler returns the node as the data plane's transfer.Handler: gets
// are written to the socket straight from the tier's memory (a pinned view),
// puts are read from the socket straight into a reservation in the fastest
// tier. observe may be nil.
func (n *Node) DataHandler(observe DataObserver) transfer.Handler {
	if observe == nil {
		observe = func(string, int, time.Time) {}
	}
	return &dataHandler{n: n, observe: observe}
}

type dataHandler struct {
	n       *Node
	observe DataObserver
}

func (d *dataHandler) Open(key index.Key) (index.Header, []byte, func(), error) {
	start := time.Now()
	v, _, err := d.n.View(key)
	if err != nil {
		return index.Header{}, nil, nil, dataError(err)
	}
	m, b := v.Meta(), v.Bytes()
	return m, b, func() {
		_ = v.Release()
		d.observe("out", len(b), start)
	}, nil
}

func (d *dataHandler) Reserve(h index.Header) ([]byte, func(bool) error, error) {
	start := time.Now()
	r, err := d.n.Reserve(h)
	if err != nil {
		return nil, nil, dataError(err)
	}
	return r.Bytes(), func(ok bool) error {
		if !ok { // the transport found the bytes did not match the sum
			r.Abort()
			return nil
		}
		if err := r.Commit(); err != nil {
			return dataError(err)
		}
		d.observe("in", int(h.Size), start)
		return nil
	}, nil
}

// dataError tags the node's errors with the data plane's sentinels.
func dataError(err error) error {
	switch {
	case errors.Is(err, tiers.ErrNotFound):
		return fmt.Errorf("%w: %v", transfer.ErrNotFound, err)
	case errors.Is(err, tiers.ErrFull), errors.Is(err, tiers.ErrNoSpace):
		return fmt.Errorf("%w: %v", transfer.ErrFull, err)
	case errors.Is(err, tiers.ErrUnavailable):
		return fmt.Errorf("%w: %v", transfer.ErrUnavailable, err)
	case errors.Is(err, ErrLimit), errors.Is(err, tiers.ErrInvalid), errors.Is(err, ErrChecksum):
		return fmt.Errorf("%w: %v", transfer.ErrRefused, err)
	}
	return err
}
