package transfer

import (
	"fmt"

	"github.com/kvstrata/kvstrata/index"
)

// Staged returns r as a plain Receiver for a transport that receives only
// into host memory: a block r's DeviceBuffer wants in device memory is
// received into the target's bounce buffer, checked there as any block,
// and copied to the device before r hears Done. end gives back the bounce
// buffers of blocks that got no Done (a Get that failed as a whole); the
// transport calls it once the Get is over and no buffer it was lent is in
// use. A Receiver without DeviceBuffer is returned as it is.
func Staged(r Receiver) (staged Receiver, end func()) {
	dr, ok := r.(DeviceReceiver)
	if !ok {
		return r, func() {}
	}
	s := &stagingReceiver{r: dr, lent: map[int]lent{}}
	return s, s.end
}

type lent struct {
	t    DeviceTarget
	buf  []byte
	done func()
}

type stagingReceiver struct {
	r    DeviceReceiver
	lent map[int]lent // blocks whose bytes go through a bounce buffer
	errs map[int]error
}

func (s *stagingReceiver) Buffer(i int, h index.Header) []byte {
	t, ok := s.r.DeviceBuffer(i, h)
	if !ok {
		return s.r.Buffer(i, h)
	}
	buf, done, err := t.Bounce(int(h.Size))
	if err == nil && len(buf) != int(h.Size) {
		done()
		err = fmt.Errorf("transfer: a bounce buffer of %d bytes for a block of %d", len(buf), h.Size)
	}
	if err != nil {
		// Receive into a buffer to throw away, and report why at Done.
		if s.errs == nil {
			s.errs = map[int]error{}
		}
		s.errs[i] = fmt.Errorf("transfer: no bounce buffer for block %v: %w", h.Key, err)
		return make([]byte, h.Size)
	}
	s.lent[i] = lent{t: t, buf: buf, done: done}
	return buf
}

func (s *stagingReceiver) Done(i int, h index.Header, err error) {
	if e, ok := s.errs[i]; ok {
		delete(s.errs, i)
		if err == nil {
			err = e
		}
	}
	if l, ok := s.lent[i]; ok {
		delete(s.lent, i)
		if err == nil {
			if uerr := l.t.Unstage(l.buf); uerr != nil {
				err = fmt.Errorf("transfer: copying block %v to the device: %w", h.Key, uerr)
			}
		}
		l.done()
	}
	s.r.Done(i, h, err)
}

func (s *stagingReceiver) end() {
	for i, l := range s.lent {
		delete(s.lent, i)
		l.done()
	}
}
