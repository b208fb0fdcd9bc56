package dataplane

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/transfer"
)

// Blocks held in GPU memory (the HBM tier) leave by one of two paths. A
// transport that can send from device memory (UCX built with CUDA) asks
// through OpenSource (transfer.SourceOpener) and sends from the block's
// device address, pinned until the send completes: device-direct. Any
// other (TCP, a UCX without CUDA) gets the block's bytes staged: copied by
// DMA into one of the HBM tier's pinned bounce buffers
// (tiers.DeviceStager), sent from there, and the buffer given back when
// the send completes. DeviceBytes counts the bytes of each path.

var (
	_ transfer.SourceOpener = (*Handler)(nil)
	_ transfer.SourceOpener = (*bound)(nil)
	_ transfer.SourceOpener = (*prefetch)(nil)
	_ transfer.SourceOpener = (*boundOpener)(nil)
)

// deviceCounts are the bytes of blocks in GPU memory the data plane sent,
// by path.
type deviceCounts struct {
	direct, staged atomic.Int64
}

// DeviceBytes returns the bytes of blocks held in GPU memory that gets
// sent straight from device memory (direct) and through pinned host
// memory (staged).
func (d *Handler) DeviceBytes() (direct, staged int64) {
	return d.dev.direct.Load(), d.dev.staged.Load()
}

// DeviceDetail says how many bytes of blocks in GPU memory left each way,
// for kvctl stats and the logs.
func (d *Handler) DeviceDetail() string {
	direct, staged := d.DeviceBytes()
	return fmt.Sprintf("device bytes sent: %d direct, %d staged", direct, staged)
}

// OpenSource is Open, except that a block held in GPU memory is handed out
// in place (transfer.SourceOpener).
func (d *Handler) OpenSource(key index.Key) (index.Header, []byte, *transfer.DeviceBlock, func(), error) {
	if d.auth != nil {
		return index.Header{}, nil, nil, nil, errCredentials
	}
	return d.openSource(key)
}

func (b *bound) OpenSource(key index.Key) (index.Header, []byte, *transfer.DeviceBlock, func(), error) {
	if !b.read {
		return index.Header{}, nil, nil, nil, b.denied("read")
	}
	return b.d.openSource(b.key(key))
}

func (o *boundOpener) OpenSource(key index.Key) (index.Header, []byte, *transfer.DeviceBlock, func(), error) {
	if so, ok := o.o.(transfer.SourceOpener); ok {
		return so.OpenSource(o.b.key(key))
	}
	h, data, release, err := o.o.Open(o.b.key(key))
	return h, data, nil, release, err
}

func (d *Handler) openSource(key index.Key) (index.Header, []byte, *transfer.DeviceBlock, func(), error) {
	start := time.Now()
	v, dv, _, err := d.n.ViewDevice(key)
	if err != nil {
		return index.Header{}, nil, nil, nil, d.failed("out", 0, start, err)
	}
	if dv == nil {
		m, b := v.Meta(), v.Bytes()
		return m, b, nil, func() {
			_ = v.Release()
			d.observe("out", len(b), start, "ok")
		}, nil
	}
	dev, release := d.deviceBlock(dv, func() { _ = dv.Release() }, start)
	return dv.Meta(), nil, dev, release, nil
}

// deviceBlock hands dv out as a transfer.DeviceBlock; release, called once
// its bytes are sent, lets go of dv through let and counts the bytes by
// the path they took.
func (d *Handler) deviceBlock(dv tiers.DeviceView, let func(), start time.Time) (*transfer.DeviceBlock, func()) {
	m := dv.Meta()
	var staged atomic.Bool
	dev := &transfer.DeviceBlock{Ptr: dv.Pointer(), Device: dv.Device(), Stage: func() ([]byte, func(), error) {
		sv, err := stage(dv)
		if err != nil {
			return nil, nil, err
		}
		staged.Store(true)
		return sv.Bytes(), func() { _ = sv.Release() }, nil
	}}
	return dev, func() {
		let()
		if staged.Load() {
			d.dev.staged.Add(int64(m.Size))
		} else {
			d.dev.direct.Add(int64(m.Size))
		}
		d.observe("out", int(m.Size), start, "ok")
	}
}

// stage copies a block in GPU memory into host memory: a pinned bounce
// buffer of its tier's (tiers.DeviceStager).
func stage(dv tiers.DeviceView) (tiers.View, error) {
	s, ok := dv.(tiers.DeviceStager)
	if !ok {
		return nil, fmt.Errorf("dataplane: block %v is in device memory that cannot be staged", dv.Meta().Key)
	}
	return s.Stage()
}

// openStaged is open for a block in GPU memory: its bytes staged into a
// bounce buffer, for a transport that sends only host memory.
func (d *Handler) openStaged(dv tiers.DeviceView, let func(), start time.Time) (index.Header, []byte, func(), error) {
	m := dv.Meta()
	sv, err := stage(dv)
	if err != nil {
		let()
		return index.Header{}, nil, nil, d.failed("out", 0, start, err)
	}
	return m, sv.Bytes(), func() {
		_ = sv.Release()
		let()
		d.dev.staged.Add(int64(m.Size))
		d.observe("out", int(m.Size), start, "ok")
	}, nil
}

func (p *prefetch) OpenSource(key index.Key) (index.Header, []byte, *transfer.DeviceBlock, func(), error) {
	asked := time.Now()
	m, b, dv, release, start, err := p.ra.NextDevice(key)
	if err != nil {
		if start.IsZero() {
			start = asked
		}
		return index.Header{}, nil, nil, nil, p.d.failed("out", 0, start, err)
	}
	if dv != nil {
		dev, rel := p.d.deviceBlock(dv, release, start)
		return m, nil, dev, rel, nil
	}
	return m, b, nil, func() {
		release()
		p.d.observe("out", len(b), start, "ok")
	}, nil
}
