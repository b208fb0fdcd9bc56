// Package dataplane serves a cache node's blocks over the data plane: it
// is the transfer.Handler of an api/node.Node. Gets are written to the
// socket straight from the tier's memory (a pinned view), puts are read
// from the socket straight into a reservation in the fastest tier.
//
// A Handler is safe for concurrent use.
package dataplane

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvstrata/kvstrata/api/gate"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/transfer"
)

// Observer is told about each block the data plane moved or could not:
// its direction ("in" for puts, "out" for gets), its size, when the
// transfer of it started, and how it ended — "ok", or Status of the error.
type Observer func(direction string, bytes int, start time.Time, status string)

// Handler is a node as the data plane's transfer.Handler.
type Handler struct {
	n       *node.Node
	observe Observer
	auth    gate.Authenticator // nil: clients are not authenticated (WithAuth)
	dev     *deviceCounts      // shared with the Handlers WithAuth derives
}

var (
	_ transfer.Handler    = (*Handler)(nil)
	_ transfer.Prefetcher = (*Handler)(nil)
)

// NewHandler returns n as a transfer.Handler; observe, if not nil, hears
// of every block moved.
func NewHandler(n *node.Node, observe Observer) *Handler {
	if observe == nil {
		observe = func(string, int, time.Time, string) {}
	}
	return &Handler{n: n, observe: observe, dev: &deviceCounts{}}
}

func (d *Handler) Open(key index.Key) (index.Header, []byte, func(), error) {
	if d.auth != nil {
		return index.Header{}, nil, nil, errCredentials
	}
	return d.open(key)
}

func (d *Handler) open(key index.Key) (index.Header, []byte, func(), error) {
	start := time.Now()
	v, dv, _, err := d.n.ViewDevice(key)
	if err != nil {
		return index.Header{}, nil, nil, d.failed("out", 0, start, err)
	}
	if dv != nil {
		return d.openStaged(dv, func() { _ = dv.Release() }, start)
	}
	m, b := v.Meta(), v.Bytes()
	return m, b, func() {
		_ = v.Release()
		d.observe("out", len(b), start, "ok")
	}, nil
}

func (d *Handler) Reserve(h index.Header) ([]byte, func(bool) error, error) {
	if d.auth != nil {
		return nil, nil, errCredentials
	}
	return d.reserve(h)
}

func (d *Handler) reserve(h index.Header) ([]byte, func(bool) error, error) {
	start := time.Now()
	r, err := d.n.Reserve(h)
	if err != nil {
		return nil, nil, d.failed("in", int(h.Size), start, err)
	}
	return r.Bytes(), func(ok bool) error {
		if !ok { // the transport found the bytes did not match the sum
			r.Abort()
			d.observe("in", int(h.Size), start, StatusCorrupt)
			return nil
		}
		if err := r.Commit(); err != nil {
			return d.failed("in", int(h.Size), start, err)
		}
		d.observe("in", int(h.Size), start, "ok")
		return nil
	}, nil
}

// Prefetch reads a Get's slow blocks ahead (see node.Node.ReadAhead).
func (d *Handler) Prefetch(keys []index.Key) transfer.Opener {
	if d.auth != nil {
		return refusing{errCredentials}
	}
	return d.prefetch(keys)
}

func (d *Handler) prefetch(keys []index.Key) transfer.Opener {
	return &prefetch{d: d, ra: d.n.ReadAhead(keys)}
}

// prefetch is the Opener of one Get.
type prefetch struct {
	d  *Handler
	ra *node.ReadAhead
}

func (p *prefetch) Open(key index.Key) (index.Header, []byte, func(), error) {
	asked := time.Now()
	m, b, dv, release, start, err := p.ra.NextDevice(key)
	if err != nil {
		if start.IsZero() {
			start = asked
		}
		return index.Header{}, nil, nil, p.d.failed("out", 0, start, err)
	}
	if dv != nil {
		return p.d.openStaged(dv, release, start)
	}
	return m, b, func() {
		release()
		p.d.observe("out", len(b), start, "ok")
	}, nil
}

func (p *prefetch) Close() { p.ra.Close() }

// failed tells the observer of a block the data plane could not move, and
// returns err tagged with the data plane's sentinels.
func (d *Handler) failed(direction string, bytes int, start time.Time, err error) error {
	err = dataError(err)
	d.observe(direction, bytes, start, Status(err))
	return err
}

// The statuses an Observer hears besides "ok".
const (
	StatusNotFound    = "not_found"   // a get of a block the node does not hold: a miss
	StatusFull        = "full"        // no room for a put
	StatusUnavailable = "unavailable" // held in a tier that cannot be reached now
	StatusRefused     = "refused"     // over a limit, or invalid
	StatusCorrupt     = "corrupt"     // a put whose bytes did not match their checksum
	StatusError       = "error"       // anything else
)

// Status names how err, a data-plane error, ended a transfer.
func Status(err error) string {
	switch {
	case errors.Is(err, transfer.ErrNotFound):
		return StatusNotFound
	case errors.Is(err, transfer.ErrFull):
		return StatusFull
	case errors.Is(err, transfer.ErrUnavailable):
		return StatusUnavailable
	case errors.Is(err, transfer.ErrRefused):
		return StatusRefused
	case errors.Is(err, transfer.ErrCorrupt):
		return StatusCorrupt
	}
	return StatusError
}

// dataError tags the node's errors with the data plane's sentinels.
func dataError(err error) error {
	switch {
	case errors.Is(err, tiers.ErrNotFound):
		return fmt.Errorf("%w: %v", transfer.ErrNotFound, err)
	case errors.Is(err, tiers.ErrFull), errors.Is(err, tiers.ErrNoSpace), errors.Is(err, tiers.ErrQuota):
		return fmt.Errorf("%w: %v", transfer.ErrFull, err)
	case errors.Is(err, tiers.ErrUnavailable):
		return fmt.Errorf("%w: %v", transfer.ErrUnavailable, err)
	case errors.Is(err, node.ErrLimit), errors.Is(err, tiers.ErrInvalid), errors.Is(err, node.ErrChecksum):
		return fmt.Errorf("%w: %v", transfer.ErrRefused, err)
	}
	return err
}
