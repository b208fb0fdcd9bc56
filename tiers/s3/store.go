package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kvstrata/kvstrata/tiers"
)

// Answers of the store that are not failures of the store: the object is
// not there, or holds fewer bytes than the index says.
var (
	errMissing = errors.New("object missing")
	errShort   = errors.New("object shorter than its index says")
)

// listPage is how many names one listing request asks for.
const listPage = 1000

// store sends the tier's requests to the object store through minio-go.
// Each request gets a deadline and bounded retries with backoff; every
// failed attempt is counted and reported to the availability state
// machine, and while that says the store is down, requests fail at once.
// minio-go's own retries are off (MaxRetries 1) so that these bounds hold.
type store struct {
	cl     *minio.Client
	core   minio.Core
	bucket string
	cfg    *Config
	avail  *availability
	ctr    *counters
}

func newStore(cfg *Config, avail *availability, ctr *counters) (*store, error) {
	tr, err := minio.DefaultTransport(cfg.Secure)
	if err != nil {
		return nil, err
	}
	// Keep a connection per request in flight: parallel ranged GETs and
	// upload parts, plus the background listings.
	tr.MaxIdleConnsPerHost = max(tr.MaxIdleConnsPerHost, 2*cfg.Concurrency+4)
	if tr.DialContext == nil {
		tr.DialContext = (&net.Dialer{}).DialContext
	}
	tr.DialContext = dialMarked(tr.DialContext) // see markedBody
	cl, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:      credentials.NewStatic(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken, credentials.SignatureV4),
		Secure:     cfg.Secure,
		Region:     cfg.Region,
		Transport:  tr,
		MaxRetries: 1,
	})
	if err != nil {
		return nil, err
	}
	return &store{cl: cl, core: minio.Core{Client: cl}, bucket: cfg.Bucket, cfg: cfg, avail: avail, ctr: ctr}, nil
}

// do runs attempt, each time under a deadline of timeout (or ctx's, if
// sooner), until it succeeds, the store answers for good, the retries
// run out, ctx ends or the store is marked unavailable. A store failure
// comes back wrapping tiers.ErrUnavailable.
//
// A failed attempt, or one the store has not begun to answer after
// ProbeTimeout (see storeAnswers), makes the store suspect
// (availability.suspect): if a probe gets no answer either, the store is
// marked unavailable and the attempt in flight is cut, as every other,
// rather than left to wait out its deadline.
func (s *store) do(ctx context.Context, op string, timeout time.Duration, attempt func(context.Context) error) error {
	evenIfDown := ctx.Value(evenIfDownKey{}) != nil
	if err := s.avail.err(); err != nil && !evenIfDown {
		return fmt.Errorf("%s: %w", op, err)
	}
	cut := s.avail.cut()
	if evenIfDown {
		cut = context.Background() // it runs while the store is down
	}
	var last error
	for try := 0; ; try++ {
		if try > 0 && cut.Err() != nil { // marked unavailable during the backoff
			return s.cutErr(op, last)
		}
		actx, cancel := context.WithTimeout(ctx, timeout)
		stopCut := context.AfterFunc(cut, cancel)
		var slow *time.Timer
		if ctx.Value(bulkKey{}) == nil {
			slow = time.AfterFunc(s.cfg.ProbeTimeout, func() {
				s.avail.suspect(fmt.Errorf("%s: no answer within %v", op, s.cfg.ProbeTimeout))
			})
			actx = context.WithValue(actx, answeringKey{}, func() {
				slow.Stop()
				s.avail.heard()
			})
		}
		err := attempt(actx)
		if slow != nil {
			slow.Stop()
		}
		stopCut()
		cancel()
		if err == nil || answered(err) {
			s.avail.success()
			return err
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return fmt.Errorf("%s: %w", op, ctx.Err()) // the caller gave up: not the store's fault
		}
		if cut.Err() != nil { // marked unavailable meanwhile: this attempt was cut
			return s.cutErr(op, err)
		}
		last = err
		s.ctr.requestErrors.Add(1)
		s.avail.failure(fmt.Errorf("%s: %w", op, err))
		if retryable(err) {
			s.avail.suspect(fmt.Errorf("%s: %w", op, err))
		}
		if try >= s.cfg.Retries || !retryable(err) || ctx.Err() != nil || s.avail.err() != nil {
			break
		}
		if !sleep(ctx, s.backoff(try)) {
			break
		}
	}
	return fmt.Errorf("%w: %s: %w", tiers.ErrUnavailable, op, last)
}

// cutErr is the error of request op cut because the store was marked
// unavailable (err: what the attempt saw); it wraps the
// *UnavailableError, or tiers.ErrUnavailable if the store is back already.
func (s *store) cutErr(op string, err error) error {
	if down := s.avail.err(); down != nil {
		return fmt.Errorf("%s: %w", op, down)
	}
	return fmt.Errorf("%w: %s: %w", tiers.ErrUnavailable, op, err)
}

// evenIfDownKey marks a ctx whose requests go to the store even while it
// is marked unavailable: the listing that must succeed before a tier
// opened offline is marked available.
type evenIfDownKey struct{}

// answeringKey holds, in an attempt's ctx, the function storeAnswers
// calls.
type answeringKey struct{}

// storeAnswers tells do that the store has begun to answer an attempt
// (the headers of a GET are in): how long the body then takes says
// nothing of a hung store, only its failure does.
func storeAnswers(ctx context.Context) {
	if f, ok := ctx.Value(answeringKey{}).(func()); ok {
		f()
	}
}

// bulkKey marks a ctx whose requests may rightly take longer than
// ProbeTimeout (segment uploads): only their failures make the store
// suspect, not their length.
type bulkKey struct{}

// backoff is the wait before retry number try+1: RetryBackoff doubled per
// retry up to 32×, then between half and all of that at random.
func (s *store) backoff(try int) time.Duration {
	d := s.cfg.RetryBackoff << min(try, 5)
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// answered reports whether err is an answer of a working store.
func answered(err error) bool {
	return errors.Is(err, errMissing) || errors.Is(err, errShort)
}

// retryable reports whether an attempt that failed with err may succeed
// when tried again: not when the store refuses the request itself.
func retryable(err error) bool {
	var r minio.ErrorResponse
	if !errors.As(err, &r) {
		return true // network errors, timeouts
	}
	switch r.Code {
	case "RequestTimeout", "SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeTooSkewed":
		return true
	}
	return r.StatusCode >= 500 || r.StatusCode == http.StatusRequestTimeout ||
		r.StatusCode == http.StatusTooManyRequests || r.StatusCode == 0
}

// classify turns minio-go's answers that are not store failures into
// errMissing and errShort.
func classify(err error) error {
	var r minio.ErrorResponse
	if !errors.As(err, &r) {
		return err
	}
	switch {
	case r.Code == "NoSuchKey" || (r.StatusCode == http.StatusNotFound && r.Code != "NoSuchBucket"):
		return fmt.Errorf("%w: %w", errMissing, err)
	case r.Code == "InvalidRange" || r.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%w: %w", errShort, err)
	}
	return err
}

// seekReaderAt is an upload body: read once per attempt from its start,
// or in parallel sections by a multipart upload.
type seekReaderAt interface {
	io.Reader
	io.ReaderAt
	io.Seeker
}

// put uploads body, size bytes, as object name, in one PUT or, over
// Config.PartSize, as a multipart upload of Concurrency parts at a time;
// each attempt may take RequestTimeout per part. It returns the ETag.
func (s *store) put(ctx context.Context, name string, body seekReaderAt, size int64) (string, error) {
	parts := max(1, (size+s.cfg.PartSize-1)/s.cfg.PartSize)
	var etag string
	ctx = context.WithValue(ctx, bulkKey{}, true)
	err := s.do(ctx, "put "+name, time.Duration(parts)*s.cfg.RequestTimeout, func(ctx context.Context) error {
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			return err
		}
		info, err := s.cl.PutObject(ctx, s.bucket, name, body, size, minio.PutObjectOptions{
			ContentType: "application/octet-stream",
			PartSize:    uint64(s.cfg.PartSize),
			NumThreads:  uint(s.cfg.Concurrency),
			// The blocks carry checksums of their own, checked on every
			// read: skip hashing the payload for the signature.
			DisableContentSha256: true,
		})
		etag = info.ETag
		return err
	})
	if err == nil {
		s.ctr.uploads.Add(1)
		s.ctr.uploadedBytes.Add(size)
	}
	return etag, err
}

// getRange appends bytes [off, off+size) of object name to dst with one
// ranged GET; size > 0. It fails with errMissing when the object is gone
// and errShort when it does not hold those bytes.
func (s *store) getRange(ctx context.Context, name string, off, size int64, dst []byte) ([]byte, error) {
	out := slices.Grow(dst, int(size))
	err := s.do(ctx, "get "+name, s.cfg.RequestTimeout, func(ctx context.Context) error {
		var opts minio.GetObjectOptions
		if err := opts.SetRange(off, off+size-1); err != nil {
			return err
		}
		s.ctr.rangedGets.Add(1)
		var conn *markConn
		resp, info, hdr, err := s.core.GetObject(traceConn(ctx, &conn), s.bucket, name, opts)
		if err != nil {
			return classify(err)
		}
		body := &markedBody{body: resp, conn: conn, left: info.Size}
		defer body.Close()
		storeAnswers(ctx)
		if hdr.Get("Content-Range") == "" {
			return fmt.Errorf("the store ignored the range header of a ranged GET")
		}
		if info.Size != size {
			return fmt.Errorf("%w: bytes [%d, %d) asked, %d returned", errShort, off, off+size, info.Size)
		}
		n, err := io.ReadFull(body, out[len(dst):len(dst)+int(size)])
		s.ctr.rangedGetBytes.Add(int64(n))
		return err
	})
	if err != nil {
		return nil, err
	}
	return out[:len(dst)+int(size)], nil
}

// getRangeInto reads the bytes of object name from off on into the
// buffers of dsts, one after another, with a ranged GET of their total
// length, calling reached(i) in order as soon as dsts[i] is filled, so
// that a caller can use the first blocks of a long range while the rest
// is still on its way. A retried attempt asks only for the bytes not read
// yet. It fails with errMissing when the object is gone and errShort when
// it does not hold those bytes; the buffers reached before a failure stay
// reached.
func (s *store) getRangeInto(ctx context.Context, name string, off int64, dsts [][]byte, reached func(i int)) error {
	var size int64
	for _, d := range dsts {
		size += int64(len(d))
	}
	var filled int64 // bytes read: dsts[:next] and part of dsts[next]
	next, in := 0, 0
	return s.do(ctx, "get "+name, s.cfg.RequestTimeout, func(ctx context.Context) error {
		var opts minio.GetObjectOptions
		if err := opts.SetRange(off+filled, off+size-1); err != nil {
			return err
		}
		s.ctr.rangedGets.Add(1)
		var conn *markConn
		resp, info, hdr, err := s.core.GetObject(traceConn(ctx, &conn), s.bucket, name, opts)
		if err != nil {
			return classify(err)
		}
		body := &markedBody{body: resp, conn: conn, left: info.Size}
		defer body.Close()
		storeAnswers(ctx)
		if hdr.Get("Content-Range") == "" {
			return fmt.Errorf("the store ignored the range header of a ranged GET")
		}
		if info.Size != size-filled {
			return fmt.Errorf("%w: bytes [%d, %d) asked, %d returned", errShort, off+filled, off+size, info.Size)
		}
		for ; next < len(dsts); next, in = next+1, 0 {
			n, err := io.ReadFull(body, dsts[next][in:])
			in += n
			filled += int64(n)
			s.ctr.rangedGetBytes.Add(int64(n))
			if err != nil {
				return err
			}
			reached(next)
		}
		return nil
	})
}

// getAll reads a whole small object of at most limit bytes and returns
// its bytes and ETag.
func (s *store) getAll(ctx context.Context, name string, limit int64) ([]byte, string, error) {
	var b []byte
	var etag string
	err := s.do(ctx, "get "+name, s.cfg.RequestTimeout, func(ctx context.Context) error {
		s.ctr.indexReads.Add(1)
		body, info, _, err := s.core.GetObject(ctx, s.bucket, name, minio.GetObjectOptions{})
		if err != nil {
			return classify(err)
		}
		defer body.Close()
		storeAnswers(ctx)
		if info.Size > limit {
			return fmt.Errorf("%w: object is %d bytes, over the %d limit", errShort, info.Size, limit)
		}
		b, err = io.ReadAll(io.LimitReader(body, limit+1))
		etag = info.ETag
		return err
	})
	return b, etag, err
}

// remove deletes object name; deleting a missing object succeeds.
func (s *store) remove(ctx context.Context, name string) error {
	return s.do(ctx, "delete "+name, s.cfg.RequestTimeout, func(ctx context.Context) error {
		return classify(s.cl.RemoveObject(ctx, s.bucket, name, minio.RemoveObjectOptions{}))
	})
}

// list calls fn for each object under prefix whose name sorts after
// startAfter, in name order. Each attempt lists one page, so a long
// listing is not one long request, and a retry resumes after the last
// name seen.
func (s *store) list(ctx context.Context, prefix, startAfter string, fn func(minio.ObjectInfo)) error {
	after := startAfter
	for {
		more := false
		err := s.do(ctx, "list "+prefix, s.cfg.RequestTimeout, func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			s.ctr.lists.Add(1)
			n := 0
			for obj := range s.cl.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{
				Prefix: prefix, Recursive: true, StartAfter: after, MaxKeys: listPage,
			}) {
				if obj.Err != nil {
					return obj.Err
				}
				fn(obj)
				after = obj.Key
				if n++; n == listPage {
					more = true
					break
				}
			}
			return nil
		})
		if err != nil || !more {
			return err
		}
	}
}

// probe asks whether the bucket is there, once, whatever the store's
// state; the probe loop uses it to find a store that is back.
func (s *store) probe(ctx context.Context, create bool) error {
	ok, err := s.cl.BucketExists(ctx, s.bucket)
	switch {
	case err != nil:
		s.ctr.requestErrors.Add(1)
		return fmt.Errorf("probe bucket %s: %w", s.bucket, err)
	case !ok && create:
		if err := s.makeBucket(ctx); err != nil {
			s.ctr.requestErrors.Add(1)
			return fmt.Errorf("probe bucket %s: create it: %w", s.bucket, err)
		}
	case !ok:
		return fmt.Errorf("probe bucket %s: bucket does not exist", s.bucket)
	}
	return nil
}

// ensureBucket checks that the bucket exists, and creates it when create
// is set.
func (s *store) ensureBucket(ctx context.Context, create bool) error {
	var ok bool
	err := s.do(ctx, "head bucket "+s.bucket, s.cfg.RequestTimeout, func(ctx context.Context) (err error) {
		ok, err = s.cl.BucketExists(ctx, s.bucket)
		return err
	})
	switch {
	case err != nil || ok:
		return err
	case !create:
		return fmt.Errorf("bucket %s does not exist (set CreateBucket to create it)", s.bucket)
	}
	return s.do(ctx, "create bucket "+s.bucket, s.cfg.RequestTimeout, s.makeBucket)
}

// makeBucket creates the bucket; one that exists already is no error.
func (s *store) makeBucket(ctx context.Context) error {
	err := s.cl.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{Region: s.cfg.Region})
	var r minio.ErrorResponse
	if errors.As(err, &r) && (r.Code == "BucketAlreadyOwnedByYou" || r.Code == "BucketAlreadyExists") {
		return nil // another node made it first
	}
	return err
}
