package s3

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// Defaults and limits of Config.
const (
	DefaultMaxBlockSize       = 4 << 20
	DefaultSegmentSize        = 64 << 20
	DefaultPartSize           = 16 << 20
	DefaultFlushInterval      = time.Second
	DefaultConcurrency        = 8
	DefaultRequestTimeout     = 5 * time.Second
	DefaultRetries            = 3
	DefaultRetryBackoff       = 100 * time.Millisecond
	DefaultFailureThreshold   = 3
	DefaultProbeInterval      = time.Second
	DefaultProbeTimeout       = time.Second
	DefaultRescanInterval     = 10 * time.Second
	DefaultMissRescanInterval = time.Second
	DefaultDeleteDelay        = 2 * time.Second
	DefaultGarbageAge         = time.Hour
	DefaultCloseTimeout       = 30 * time.Second

	// UnlimitedCapacity is the capacity Stats reports when Config.Capacity
	// is 0.
	UnlimitedCapacity = 1 << 62
	// MaxBlockLimit is the largest MaxBlockSize allowed.
	MaxBlockLimit = 1 << 30
	// MaxSegmentSize is the largest SegmentSize allowed.
	MaxSegmentSize = 4 << 30
	// MinPartSize and MaxPartSize bound PartSize, as S3 bounds the parts
	// of a multipart upload.
	MinPartSize = 5 << 20
	MaxPartSize = 5 << 30
	// MaxConcurrency is the largest Concurrency allowed.
	MaxConcurrency = 1024
)

// Config configures a Tier. The zero value of every field but Endpoint
// and Bucket means its default; Open applies them with EnsureDefaults.
type Config struct {
	// Endpoint is the object store's address, host:port, without a scheme
	// ("s3.us-east-1.amazonaws.com:443", "127.0.0.1:9000"). Required.
	Endpoint string
	// Bucket holds the tier's objects; every node of a cluster that points
	// at the same Bucket and Prefix shares one tier. Required.
	Bucket string
	// Prefix is put before every object name, without a leading or
	// trailing slash ("kvstrata/prod"); empty means the bucket's root.
	Prefix string
	// Region is the bucket's region. Empty means ask the store (one
	// request per Open).
	Region string
	// Secure talks to the store over TLS.
	Secure bool
	// AccessKey, SecretKey and SessionToken sign requests. When AccessKey
	// and SecretKey are both empty, they and SessionToken are read from
	// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN; when
	// those are empty too, requests go unsigned.
	AccessKey, SecretKey, SessionToken string
	// CreateBucket creates Bucket at Open when it does not exist; without
	// it Open fails on a missing bucket.
	CreateBucket bool
	// OpenOffline lets Open succeed when the store cannot be reached
	// (network errors, timeouts, the store saying it is unavailable): the
	// tier starts unavailable and empty, puts buffer as in any outage, and
	// once a probe reaches the store the tier checks (or creates) the
	// bucket, lists every index and is marked available. A store that
	// answers and refuses — bad credentials, a missing bucket without
	// CreateBucket — still fails Open. The default, false, fails Open
	// whenever the store cannot be reached.
	OpenOffline bool
	// Capacity is the most bytes of live blocks the tier holds, counting
	// each block as its size plus BlockOverhead (Stats.Used), across every
	// node that shares the bucket: the blocks other nodes wrote count too.
	// Bytes of deleted blocks that still sit in segment objects are not
	// counted (S3Stats.StoredBytes has them). A rescan that finds other
	// nodes' blocks may take Used past Capacity; Put then fails with
	// tiers.ErrFull until deletes bring it under. 0, the default, means no
	// limit, reported as UnlimitedCapacity.
	Capacity int64
	// MaxBlockSize is the largest block Put accepts, in bytes; at most
	// MaxBlockLimit, Capacity (when set) and MaxPendingBytes. The default
	// is 4 MiB, or Capacity when that is smaller.
	MaxBlockSize int64
	// SegmentSize is the target size in bytes of one segment object: a
	// segment is uploaded once its blocks reach it (or FlushInterval has
	// passed). Larger segments mean fewer objects and requests; a segment
	// is deleted only when all its blocks are, so they also keep deleted
	// bytes longer. At most MaxSegmentSize. The default is 64 MiB.
	SegmentSize int64
	// PartSize is the part size of the multipart upload that sends a
	// segment larger than it; a smaller segment goes in one PUT. From
	// MinPartSize to MaxPartSize. The default is 16 MiB.
	PartSize int64
	// FlushInterval is how long a partly filled segment waits for more
	// blocks before it is uploaded anyway. The default is 1s.
	FlushInterval time.Duration
	// MaxPendingBytes bounds the block bytes held in memory until they are
	// uploaded. A Put that would pass it fails at once with an error
	// wrapping tiers.ErrBusy and ErrBacklog, so that the caller drops the
	// block or keeps it where it is; Put never waits. The default is four
	// segments or four blocks, whichever is more: 4×max(SegmentSize,
	// MaxBlockSize).
	MaxPendingBytes int64
	// ReadBuffers is how many bytes of released read buffers the tier
	// keeps for reuse (GetManyPooled's): a restore that keeps N ranged
	// GETs of whole segments in flight goes through about N segments of
	// buffers, and buffers let go past this bound are left to the garbage
	// collector, so that the next restore maps fresh memory for them. The
	// default is four segments, 4×SegmentSize, for the four reads in
	// flight of a node's default read ahead.
	ReadBuffers int64
	// Concurrency is the number of ranged GETs in flight at once (Get and
	// GetMany share them), of segment uploads in flight at once, and of
	// the parts one multipart upload sends in parallel. From 1 to
	// MaxConcurrency. The default is 8.
	Concurrency int
	// RequestTimeout bounds how long a Get, Stat or GetMany of one block
	// waits for the store, retries included, and each attempt of a
	// background request; a segment upload gets RequestTimeout per part.
	// The default is 5s.
	RequestTimeout time.Duration
	// Retries is how many times a failed request is tried again (within
	// RequestTimeout for a caller's request); negative means never. The
	// default is 3.
	Retries int
	// RetryBackoff is the wait before the first retry; each further
	// retry waits twice as long, up to 32×RetryBackoff, with random jitter.
	// The default is 100ms.
	RetryBackoff time.Duration
	// FailureThreshold is the number of failed request attempts in a row
	// (each retry is one) after which the tier is marked unavailable (see
	// Tier.Available). The default is 3: one request that fails with its
	// default retries marks it.
	FailureThreshold int
	// ProbeInterval is how often an unavailable tier asks the store
	// whether the bucket is back. The default is 1s.
	ProbeInterval time.Duration
	// ProbeTimeout is the deadline of a probe: a HEAD of the bucket that
	// asks whether the store answers at all. A probe starts as soon as a
	// request fails or has gone ProbeTimeout without an answer (a segment
	// upload only when it fails); when the probe gets no answer either,
	// the tier is marked unavailable at once, without waiting for
	// FailureThreshold failures, and the requests in flight are cut. A
	// hung store is thus noticed within about 2×ProbeTimeout rather than a
	// RequestTimeout per caller. The recovery probes of an unavailable
	// tier (ProbeInterval) have the same deadline. A store that answers a
	// HEAD slower than this is taken for down. At most RequestTimeout. The
	// default is 1s, or RequestTimeout when that is shorter.
	ProbeTimeout time.Duration
	// RescanInterval is how often the tier lists every index object of
	// the bucket to learn the segments other nodes wrote or deleted. The
	// default is 10s.
	RescanInterval time.Duration
	// MissRescanInterval is how often, at most, a Get or Stat of a key
	// the tier does not know lists the indexes written in the last minute
	// before answering tiers.ErrNotFound; negative turns that off. The
	// default is 1s.
	MissRescanInterval time.Duration
	// DeleteDelay is how long deletes gather before the index objects they
	// touch are rewritten, so that a burst of deletes costs one rewrite per
	// segment. The default is 2s.
	DeleteDelay time.Duration
	// GarbageAge is how long ago (by the store's clock) a data object that
	// no index object names must have been written before a rescan
	// deletes it: what a crash between a segment's data and index
	// uploads, or a failed delete, leaves behind. It must exceed the
	// longest gap between the two uploads of any node sharing the bucket.
	// Negative turns the sweep off. The default is 1h.
	GarbageAge time.Duration
	// CloseTimeout bounds how long Close spends uploading pending
	// segments and applying deletes. The default is 30s.
	CloseTimeout time.Duration
	// Logger receives the tier's background errors and availability
	// changes. The default is slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults replaces the zero value of every optional field with its
// default, and reads the credentials from the environment when none are
// set. It leaves invalid values for Validate to report.
func (c *Config) EnsureDefaults() {
	if c.AccessKey == "" && c.SecretKey == "" {
		c.AccessKey = os.Getenv("AWS_ACCESS_KEY_ID")
		c.SecretKey = os.Getenv("AWS_SECRET_ACCESS_KEY")
		if c.SessionToken == "" {
			c.SessionToken = os.Getenv("AWS_SESSION_TOKEN")
		}
	}
	if c.MaxBlockSize == 0 {
		c.MaxBlockSize = DefaultMaxBlockSize
		if c.Capacity > 0 && c.Capacity < c.MaxBlockSize {
			c.MaxBlockSize = c.Capacity
		}
	}
	setDefault(&c.SegmentSize, DefaultSegmentSize)
	setDefault(&c.PartSize, DefaultPartSize)
	setDefault(&c.FlushInterval, DefaultFlushInterval)
	setDefault(&c.MaxPendingBytes, 4*max(c.SegmentSize, c.MaxBlockSize))
	setDefault(&c.ReadBuffers, 4*c.SegmentSize)
	setDefault(&c.Concurrency, DefaultConcurrency)
	setDefault(&c.RequestTimeout, DefaultRequestTimeout)
	setDefault(&c.Retries, DefaultRetries)
	setDefault(&c.RetryBackoff, DefaultRetryBackoff)
	setDefault(&c.FailureThreshold, DefaultFailureThreshold)
	setDefault(&c.ProbeInterval, DefaultProbeInterval)
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
		if c.RequestTimeout > 0 {
			c.ProbeTimeout = min(c.ProbeTimeout, c.RequestTimeout)
		}
	}
	setDefault(&c.RescanInterval, DefaultRescanInterval)
	setDefault(&c.MissRescanInterval, DefaultMissRescanInterval)
	setDefault(&c.DeleteDelay, DefaultDeleteDelay)
	setDefault(&c.GarbageAge, DefaultGarbageAge)
	setDefault(&c.CloseTimeout, DefaultCloseTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func setDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// Validate reports every problem of c in one error that wraps
// tiers.ErrInvalidConfig. Call it after EnsureDefaults: zero values of
// optional fields are reported as invalid.
func (c *Config) Validate() error {
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	if err := checkEndpoint(c.Endpoint); err != nil {
		bad("Endpoint %v", err)
	}
	if c.Bucket == "" {
		bad("Bucket is empty")
	} else if err := s3utils.CheckValidBucketNameStrict(c.Bucket); err != nil {
		bad("Bucket %q: %v", c.Bucket, err)
	}
	if err := checkPrefix(c.Prefix); err != nil {
		bad("Prefix %q %v", c.Prefix, err)
	}
	if (c.AccessKey == "") != (c.SecretKey == "") {
		bad("AccessKey and SecretKey must be set together")
	}
	if c.Capacity < 0 {
		bad("Capacity is %d, want ≥ 0 (0 for no limit)", c.Capacity)
	}
	switch {
	case c.MaxBlockSize <= 0:
		bad("MaxBlockSize is %d, want > 0", c.MaxBlockSize)
	case c.MaxBlockSize > MaxBlockLimit:
		bad("MaxBlockSize is %s, over the %s limit", units.FormatBytes(c.MaxBlockSize), units.FormatBytes(MaxBlockLimit))
	case c.Capacity > 0 && c.MaxBlockSize > c.Capacity:
		bad("MaxBlockSize (%s) is over Capacity (%s)", units.FormatBytes(c.MaxBlockSize), units.FormatBytes(c.Capacity))
	case c.MaxPendingBytes > 0 && c.MaxBlockSize > c.MaxPendingBytes:
		bad("MaxBlockSize (%s) is over MaxPendingBytes (%s)", units.FormatBytes(c.MaxBlockSize), units.FormatBytes(c.MaxPendingBytes))
	}
	if c.SegmentSize <= 0 || c.SegmentSize > MaxSegmentSize {
		bad("SegmentSize is %d, want 1 to %d bytes", c.SegmentSize, int64(MaxSegmentSize))
	}
	if c.PartSize < MinPartSize || c.PartSize > MaxPartSize {
		bad("PartSize is %d, want %d to %d bytes", c.PartSize, int64(MinPartSize), int64(MaxPartSize))
	}
	if c.ReadBuffers < 0 {
		bad("ReadBuffers is %d, want ≥ 0", c.ReadBuffers)
	}
	if c.MaxPendingBytes <= 0 {
		bad("MaxPendingBytes is %d, want > 0", c.MaxPendingBytes)
	}
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		bad("Concurrency is %d, want 1 to %d", c.Concurrency, MaxConcurrency)
	}
	if c.Retries > 100 {
		bad("Retries is %d, want at most 100", c.Retries)
	}
	if c.FailureThreshold < 1 {
		bad("FailureThreshold is %d, want > 0", c.FailureThreshold)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"FlushInterval", c.FlushInterval},
		{"RequestTimeout", c.RequestTimeout},
		{"RetryBackoff", c.RetryBackoff},
		{"ProbeInterval", c.ProbeInterval},
		{"ProbeTimeout", c.ProbeTimeout},
		{"RescanInterval", c.RescanInterval},
		{"DeleteDelay", c.DeleteDelay},
		{"CloseTimeout", c.CloseTimeout},
	} {
		if d.v <= 0 {
			bad("%s is %v, want > 0", d.name, d.v)
		}
	}
	if c.ProbeTimeout > c.RequestTimeout && c.RequestTimeout > 0 {
		bad("ProbeTimeout (%v) is over RequestTimeout (%v): a probe would notice a hung store no sooner than the requests",
			c.ProbeTimeout, c.RequestTimeout)
	}
	if c.Logger == nil {
		bad("Logger is nil")
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("s3: %w: %s", tiers.ErrInvalidConfig, strings.Join(problems, "; "))
}

// checkEndpoint accepts host:port, nothing more.
func checkEndpoint(ep string) error {
	if ep == "" {
		return fmt.Errorf("is empty")
	}
	if strings.Contains(ep, "://") || strings.Contains(ep, "/") {
		return fmt.Errorf("%q has a scheme or a path; want host:port (Secure chooses TLS)", ep)
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("%q is not host:port", ep)
	}
	return nil
}

// checkPrefix accepts a relative object-name prefix of clean path
// segments.
func checkPrefix(p string) error {
	switch {
	case p == "":
		return nil
	case len(p) > 512:
		return fmt.Errorf("is %d bytes, over 512", len(p))
	case !utf8.ValidString(p):
		return fmt.Errorf("is not valid UTF-8")
	case strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/"):
		return fmt.Errorf("starts or ends with a slash")
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("has an empty, . or .. path segment")
		}
	}
	return nil
}
