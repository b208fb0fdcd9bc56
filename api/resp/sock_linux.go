package resp

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// rawSock reads and writes a connection's socket with raw system calls
// (no runtime bookkeeping), waiting for it through Go's poller.
//
// The socket is non-blocking, so a read or write returns at once: it
// copies what the socket holds or has room for, or fails with EAGAIN,
// and the goroutine then parks in the poller as net.Conn's Read would.
// What differs is the call itself. Through net.Conn each read and
// writev enters and leaves the scheduler's syscall state: a call that
// copies 64 KiB can outlast a tick of the runtime's monitor thread
// (20 µs and up), which may then hand the processor to another thread
// for the goroutines waiting to run, and the calling thread finds it
// gone when the call returns. A raw call keeps its processor, as a
// memcpy would; it never blocks. Under redis-benchmark (-c 8, 64 KiB
// GETs) this took the node's CPU per request down by a sixth to a third.
// Deadlines and Close work as on net.Conn (syscall.RawConn waits through
// the same poller).
//
// One goroutine may read while another writes, as with net.Conn: the
// two directions keep the state of their calls apart. Two concurrent
// reads, or two concurrent writes, are not allowed.
type rawSock struct {
	rc syscall.RawConn

	// The calls in progress, kept here so that the functions handed to rc
	// are method values made once, not closures allocated per call.
	rd, wr sockCall
	iov    []syscall.Iovec // the writev in progress
	readFn func(fd uintptr) bool
	wrFn   func(fd uintptr) bool
	wvFn   func(fd uintptr) bool
}

// sockCall is one direction's call in progress: its buffer and result.
type sockCall struct {
	p     []byte
	n     int
	errno syscall.Errno
}

var _ buffersWriter = (*rawSock)(nil)

// newSock returns nc's socket read and written with raw system calls, or
// nc itself when it is not a plain socket (TLS, a pipe).
func newSock(nc net.Conn) io.ReadWriter {
	var rc syscall.RawConn
	var err error
	switch c := nc.(type) {
	case *net.TCPConn:
		rc, err = c.SyscallConn()
	case *net.UnixConn:
		rc, err = c.SyscallConn()
	default:
		return nc
	}
	if err != nil {
		return nc
	}
	s := &rawSock{rc: rc}
	s.readFn, s.wrFn, s.wvFn = s.read, s.write, s.writev
	return s
}

// Read reads into p as net.Conn's Read does: io.EOF at the end of input.
func (s *rawSock) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.rd = sockCall{p: p}
	err := s.rc.Read(s.readFn)
	n, errno := s.rd.n, s.rd.errno
	s.rd.p = nil
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, os.NewSyscallError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (s *rawSock) read(fd uintptr) bool {
	return s.rd.call(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&s.rd.p[0])), uintptr(len(s.rd.p)))
}

func (s *rawSock) write(fd uintptr) bool {
	return s.wr.call(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&s.wr.p[0])), uintptr(len(s.wr.p)))
}

func (s *rawSock) writev(fd uintptr) bool {
	return s.wr.call(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.iov[0])), uintptr(len(s.iov)))
}

// call makes one raw system call on the socket, again if a signal cut it
// short, and records its result. It reports false on EAGAIN: the poller
// then waits for the socket and calls again.
func (c *sockCall) call(trap, fd, buf, n uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(trap, fd, buf, n)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		case 0:
			c.n = int(r)
		default:
			c.errno = e
		}
		return true
	}
}

// Write writes all of p, waiting for room in the socket as it must.
func (s *rawSock) Write(p []byte) (int, error) {
	var done int
	for len(p) > 0 {
		s.wr = sockCall{p: p}
		err := s.rc.Write(s.wrFn)
		n, errno := s.wr.n, s.wr.errno
		s.wr.p = nil
		done += n
		p = p[n:]
		if err != nil {
			return done, err
		}
		if errno != 0 {
			return done, os.NewSyscallError("write", errno)
		}
		if n == 0 {
			return done, io.ErrShortWrite
		}
	}
	return done, nil
}

// maxIovecs is the most buffers one writev takes (Linux's UIO_MAXIOV).
const maxIovecs = 1024

// WriteBuffers writes every buffer of bufs, in order, with writev, and
// returns the bytes written (buffersWriter); bufs is left as it was.
func (s *rawSock) WriteBuffers(bufs [][]byte) (int64, error) {
	var done int64
	i, off := 0, 0 // the first byte not written: bufs[i][off]
	for {
		for i < len(bufs) && off == len(bufs[i]) {
			i, off = i+1, 0
		}
		if i == len(bufs) {
			return done, nil
		}
		s.iov = s.iov[:0]
		for j := i; j < len(bufs) && len(s.iov) < maxIovecs; j++ {
			b := bufs[j]
			if j == i {
				b = b[off:]
			}
			if len(b) == 0 {
				continue
			}
			v := syscall.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			s.iov = append(s.iov, v)
		}
		s.wr = sockCall{}
		err := s.rc.Write(s.wvFn)
		n, errno := s.wr.n, s.wr.errno
		clear(s.iov) // drop the pointers into the buffers
		done += int64(n)
		for left := n; left > 0; {
			k := min(left, len(bufs[i])-off)
			left -= k
			if off += k; off == len(bufs[i]) {
				i, off = i+1, 0
			}
		}
		if err != nil {
			return done, err
		}
		if errno != 0 {
			return done, os.NewSyscallError("writev", errno)
		}
		if n == 0 {
			return done, io.ErrShortWrite
		}
	}
}
