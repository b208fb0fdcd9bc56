// Package config is the configuration of `kvstrata serve`: a documented
// struct, its defaults, and one table of settings that binds every field to
// a config-file key, an environment variable and a flag.
//
// Precedence, lowest first: built-in defaults, the config file (--config or
// KVSTRATA_CONFIG), environment variables (KVSTRATA_…), command-line flags.
// Every layer is parsed by the same code, so "64MiB" means the same in all
// of them, and Validate reports every problem at once.
package config

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/policy"
)

// maxRecordCache bounds ssd.record-cache: 1 GiB of 48-byte records, as
// the SSD tier's own bound (ssd.MaxRecordCache).
const maxRecordCache = (1 << 30) / 48

// Config is the whole configuration of a cache node. Zero sizes marked
// "auto" are resolved from the machine by Resolve.
type Config struct {
	// NodeID identifies the node in its cluster; > 0. Default 1.
	NodeID uint32
	// DataDir holds the node's persistent state (the SSD tier, the raft
	// log). A running node holds it, and SSD.Dir, with an flock on the file
	// kvstrata.lock there: a second node on either is refused at start.
	// Default "./data".
	DataDir string
	Listen  Listen
	HBM     HBM
	DRAM    DRAM
	SSD     SSD
	S3      S3
	Cluster Cluster
	Limits  Limits
	// FetchConcurrency sizes the read ahead of a restore (a data-plane get
	// of a chain) from the SSD and the object store: FetchConcurrency/4
	// reads in flight, each of up to 16 blocks (from an object store, the
	// rest of one segment object, up to 64 MiB), and how many blocks a
	// warm reads at once. Each read in flight holds its blocks in memory
	// until they are sent. From 1 to 1024; default 16 (4 reads in flight).
	FetchConcurrency int
	// Transport is the data-plane backend: "tcp" (default) or "ucx" (in
	// binaries built with the ucx tag).
	Transport string
	// UCX tunes the ucx transport.
	UCX UCX
	// Advertise is what the node tells others to dial, where that is not
	// where it listens.
	Advertise Advertise
	// LogLevel is debug, info (default), warn or error.
	LogLevel string
	// LogFormat is text (default) or json.
	LogFormat string
	// ShutdownTimeout bounds a graceful shutdown. Default 30s.
	ShutdownTimeout time.Duration
	// Pprof serves Go's profiler under /debug/pprof/ on the HTTP address.
	// Default false.
	Pprof bool
	// TLS encrypts the node's listeners; off until a certificate is set.
	TLS TLS
	// Auth makes every port authenticate its clients; off until a users
	// file is set.
	Auth Auth
	// Insecure holds the switches that let a node run in ways that are
	// unsafe outside a trusted network.
	Insecure Insecure
}

// TLS configures encryption. With CertFile and KeyFile set, gRPC, HTTP,
// the TCP data plane and the raft transport speak TLS only, and
// Listen.RESPTLS serves the Redis protocol over TLS (Listen.RESP stays
// plain, as Redis's port beside its tls-port). Files are read again on
// SIGHUP; connections already open keep theirs.
type TLS struct {
	// CertFile and KeyFile are the node's PEM certificate chain and key,
	// used as server and, towards its peers, as client. Default empty.
	CertFile, KeyFile string
	// CAFile holds the PEM certificates that client and peer certificates
	// must chain to (mTLS), and that the node trusts when it dials its
	// peers. Default empty: the system's roots.
	CAFile string
	// ClientAuth is none, optional (verify a certificate if one is given;
	// the default) or require.
	ClientAuth string
}

// Auth configures authentication and authorization.
type Auth struct {
	// UsersFile lists users, their hashed secrets, roles and tenants
	// (docs/security.md); read again on SIGHUP. Default empty: no
	// authentication.
	UsersFile string
	// ClusterTokenFile holds the secret every member of the cluster
	// presents to the others (raft, the gRPC Cluster service, peer data
	// plane), one token a line: the first is presented, each accepted
	// (a rotation); read again on SIGHUP. Default empty: members prove themselves with certificates
	// that chain to tls.ca-file, or, without TLS, not at all.
	ClusterTokenFile string
}

// Insecure holds the unsafe switches.
type Insecure struct {
	// AllowRemote lets a node listen on a non-loopback address without
	// TLS and authentication. Default false: such a node refuses to start.
	AllowRemote bool
}

// Listen holds the addresses the node serves on; an empty address turns that
// server off (except gRPC).
type Listen struct {
	GRPC string // control plane; default 127.0.0.1:7070
	Data string // data plane; default 127.0.0.1:7071
	RESP string // Redis protocol; default 127.0.0.1:6380
	HTTP string // /metrics, /healthz, /readyz; default 127.0.0.1:9090
	// RESPTLS serves the Redis protocol over TLS (as Redis's tls-port);
	// needs tls.cert-file. Default empty: off.
	RESPTLS string
}

// HBM configures the GPU-memory tier, above DRAM. It is off until a
// capacity is set, and exists only in binaries built with the cuda tag
// (make build-cuda), which load the CUDA driver at run time.
type HBM struct {
	// Capacity is the device memory the tier allocates at start. Default
	// 0: no HBM tier.
	Capacity ByteSize
	// Device is the GPU's ordinal. Default 0.
	Device int
	// PageSize is the tier's allocation unit. Default 64KiB.
	PageSize ByteSize
	// Policy is the tier's eviction policy, as for DRAM. Default s3fifo.
	Policy string
	// HighWatermark and LowWatermark as for DRAM. Defaults 0.95 and 0.85.
	HighWatermark, LowWatermark float64
	// GDS is how a block promoted out of the SSD tier is read from its
	// file into device memory: "auto" (the default) through cuFile where
	// libcufile.so.0 loads — GPUDirect Storage, or cuFile's compatibility
	// mode where the nvidia-fs module is missing — else "staged"; "staged"
	// by pread into pinned host buffers and a copy to the device; "off"
	// through the SSD tier's Get and a copy from the heap.
	GDS string
	// GDSTrustDisk skips the check of blocks cuFile reads into device
	// memory against their checksum (by default they are copied back into
	// pinned host memory and hashed before they are stored). Default false.
	GDSTrustDisk bool
}

// HBMBuilt says whether this binary has the HBM tier (the cuda tag); the
// daemon's cuda build sets it.
var HBMBuilt = false

// DRAM configures the host-memory tier.
type DRAM struct {
	// Capacity in bytes; 0 (auto, the default) takes a quarter of the
	// available memory, at least 64 MiB and at most 64 GiB.
	Capacity ByteSize
	// PageSize is the arena's allocation unit. Default 4KiB.
	PageSize ByteSize
	// Policy is s3fifo (default), lru, lfu, prefix, wtinylfu,
	// s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix or lhd. S3-FIFO keeps
	// blocks used once from pushing out blocks used again; on the Mooncake
	// traces it beats LRU at every capacity measured (docs/BENCHMARKS.md).
	Policy string
	// HighWatermark and LowWatermark bound background demotion, as
	// fractions of capacity. Defaults 0.95 and 0.85.
	HighWatermark, LowWatermark float64
}

// SSD configures the local-SSD tier.
type SSD struct {
	// Enabled turns the tier on. Default true.
	Enabled bool
	// Dir is where Pebble keeps its files. Default <DataDir>/ssd.
	Dir string
	// Capacity in bytes; 0 (auto, the default) takes a quarter of the free
	// space of Dir's file system, at most 256 GiB.
	Capacity ByteSize
	// Policy is lru (default), lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix,
	// wtinylfu-prefix, arc, arc-prefix or lhd. The SSD holds DRAM's
	// victims, a victim cache for which LRU order measures best.
	Policy string
	// AdmitMinSeen admits a DRAM victim only if it was accessed at least
	// this often lately. Default 1 (admit every victim).
	AdmitMinSeen int
	// AdmitByFrequency admits a DRAM victim to a full SSD only if it was
	// accessed more often lately than the SSD block it would displace
	// (TinyLFU admission); AdmitMinSeen is then not used. Default false.
	AdmitByFrequency bool
	// HighWatermark and LowWatermark as for DRAM. Defaults 0.95 and 0.85.
	HighWatermark, LowWatermark float64
	// WAL makes every acknowledged block survive a crash, at about twice
	// the bytes written. Default false: a crash may lose the blocks of the
	// last flush interval, never return a corrupt one.
	WAL bool
	// FileMinSize is the smallest block kept in a file of its own, read
	// with one pread straight into the caller's buffer (and by an HBM
	// tier through GPUDirect Storage); smaller blocks stay inside Pebble.
	// Default 64KiB, where a file starts to read at least as fast as an
	// inline value. Changing it leaves the blocks already written where
	// they are.
	FileMinSize ByteSize
	// OpenFiles is how many block files of blocks under 512 KiB the tier
	// keeps open between reads, the most recently read: such a read then
	// costs no open or close. Each takes a file descriptor, and the tier
	// takes at most a quarter of the process's limit. Default 4096; 0
	// keeps none open.
	OpenFiles int
	// RecordCache is how many blocks' metadata records the tier keeps in
	// memory, those read or written lately, so that a read of a block
	// does not look its record up in Pebble: 48 bytes each, allocated at
	// start. Default 65536 (3 MiB, the records of 4 GiB of 64 KiB
	// blocks); 0 keeps none; at most 22369621 (1 GiB).
	RecordCache int
	// ReadAhead is how many bytes of block files a chain's read asks the
	// kernel for ahead of the blocks it has read, so that the disk works on
	// a deep queue of requests. Default 32MiB.
	ReadAhead ByteSize
}

// S3 configures the object-store tier, the bottom of the hierarchy, shared
// by every node that points at the same bucket and prefix. It is off until
// an endpoint is set.
type S3 struct {
	// Endpoint is host:port of any S3-compatible store; empty turns the
	// tier off (the default).
	Endpoint string
	// Bucket holds the tier's objects. Default "kvstrata".
	Bucket string
	// Prefix goes before every object name ("prod/kvstrata"). Default
	// empty.
	Prefix string
	// Region of the bucket. Default "us-east-1".
	Region string
	// Secure talks TLS to the store. Default false.
	Secure bool
	// AccessKey and SecretKey sign requests; when both are empty they
	// come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
	AccessKey, SecretKey string
	// CreateBucket creates a missing bucket at start. Default true.
	CreateBucket bool
	// RequireAtStart refuses to start when the store cannot be reached.
	// Default false: the node starts with the s3 tier unavailable, serves
	// from DRAM and SSD, and lists the bucket once the store answers.
	RequireAtStart bool
	// Capacity caps the bytes the tier holds; 0 (default) is unlimited.
	Capacity ByteSize
	// Policy is lru (default), lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix,
	// wtinylfu-prefix, arc, arc-prefix or lhd.
	Policy string
	// PromoteTo lists the tiers a hit in the object store is copied into:
	// "dram" (default), "ssd" or "dram,ssd".
	PromoteTo string
	// SegmentSize is the target size of one segment object. Default 64MiB.
	SegmentSize ByteSize
	// FlushInterval uploads a partly filled segment after this long.
	// Default 1s.
	FlushInterval time.Duration
	// MaxPending bounds the bytes waiting for upload; over it, SSD victims
	// are dropped rather than queued. Default 256MiB.
	MaxPending ByteSize
	// Concurrency is the number of parallel uploads and ranged GETs.
	// Default 16. How many reads a restore keeps in flight is
	// FetchConcurrency's.
	Concurrency int
	// GarbageAge is how long after its upload a data object that no index
	// names (a crash between a segment's two uploads) is deleted; 0 never
	// deletes. Default 1h.
	GarbageAge time.Duration
	// ProbeTimeout is the deadline of the probe (a HEAD of the bucket)
	// that a failed read, or one without an answer for this long, starts:
	// when the probe gets no answer either, the tier is marked unavailable
	// and the reads in flight fail at once, so that a hung store holds a
	// read about twice this long rather than its 5s request deadline,
	// which it may not exceed. Default 1s.
	ProbeTimeout time.Duration
}

// Cluster configures the node's membership in a cluster that shares a
// Raft-replicated block directory. A node without cluster state and with
// neither Bootstrap nor Join starts a cluster of itself.
type Cluster struct {
	// Name names the node for people. Default: its host name and node id.
	Name string
	// RaftAddr is where the node's raft transport listens, and what its
	// peers dial unless advertise.raft or advertise.host says otherwise.
	// Default 127.0.0.1:7072.
	RaftAddr string
	// Bootstrap lists the voters of a new cluster, "1=host:7072,2=…", this
	// node among them; used only by a node without cluster state.
	Bootstrap string
	// Join is the gRPC address of a member to join through; used only by a
	// node without cluster state.
	Join string
	// HeartbeatInterval is how often the node tells the leader it is
	// alive. Default 500ms.
	HeartbeatInterval time.Duration
	// LivenessTimeout is how long a node may be silent before the leader
	// marks it down and lookups stop returning its blocks. Default 5s.
	LivenessTimeout time.Duration
	// ReconcileInterval is how often, on average, the node compares what
	// the directory lists at it with what its tiers hold and publishes
	// the corrections (a pass also follows any change the node had to
	// drop). 0 turns it off. Default 1m.
	ReconcileInterval time.Duration
	// SkipEntries lists raft log indices, "1234,5678", of entries of
	// unknown types that the node applies as no-ops instead of stopping:
	// the way out when such an entry is known not to come from a newer
	// kvstrata (it was let into the log before proposals were validated).
	// Every node must be given the same list. Empty by default.
	SkipEntries string
}

// UCX tunes the UCX data plane (binaries built with the ucx tag).
type UCX struct {
	// TLS lists the UCX transports to use, as UCX_TLS takes them
	// ("posix,cma,self" for shared memory, "tcp", "rc,ud" for RDMA).
	// Empty (the default) lets UCX pick the best the machine has.
	TLS string
	// NetDevices lists the network devices UCX may use, as
	// UCX_NET_DEVICES takes them ("mlx5_0:1", "eth0"). Default: all.
	NetDevices string
}

// Limits protect the node; requests over them are refused whole.
type Limits struct {
	MaxBlockSize   ByteSize // default 4MiB
	MaxBatchBlocks int      // default 1024
	MaxBatchBytes  ByteSize // default 256MiB
	// MaxConnections caps the data-plane and RESP connections each. Default
	// 1024. A RESP server at it makes room for a new connection by closing
	// one whose command arrives slower than MinRequestRate, else one idle
	// for longer than RequestTimeout.
	MaxConnections int
	// RequestTimeout and MinRequestRate bound how long a RESP command or a
	// data-plane request may take to arrive once it has begun:
	// RequestTimeout plus a second for every MinRequestRate bytes of it
	// received, however often its bytes trickle in. Defaults 10s and 1MiB
	// (per second).
	RequestTimeout time.Duration
	MinRequestRate ByteSize
	// MaxValueSize is the largest value a RESP client may store (SET); a
	// value over MaxBlockSize is kept as several blocks. A longer one is
	// read, dropped and answered with an error naming this limit. Default
	// 512MiB (Redis's proto-max-bulk-len); at most 1GiB.
	MaxValueSize ByteSize
	// MaxPendingRESPBytes bounds the memory all RESP commands not yet
	// received whole hold together; memory follows the bytes received, not
	// the lengths announced. At least twice MaxValueSize plus
	// RESPCommandSlack (a value's buffer is held twice for a moment while
	// it grows, beside the command's name and key), twice MaxBlockSize and
	// 16MiB. Default 1.5GiB.
	MaxPendingRESPBytes ByteSize
	// MaxPendingPutBytes bounds the DRAM the data plane holds reserved for
	// blocks still arriving. Default 0: a quarter of dram.capacity.
	MaxPendingPutBytes ByteSize
}

// RESPCommandSlack is the room a RESP command has, beside one value of
// limits.max-value-size, for its name and key (SET key value): a command
// may carry MaxValueSize plus this many bytes.
const RESPCommandSlack = 1 << 20

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		NodeID:  1,
		DataDir: "./data",
		Listen: Listen{
			GRPC: "127.0.0.1:7070", Data: "127.0.0.1:7071",
			RESP: "127.0.0.1:6380", HTTP: "127.0.0.1:9090",
		},
		HBM:  HBM{PageSize: 64 << 10, Policy: policy.DefaultHBM, HighWatermark: 0.95, LowWatermark: 0.85, GDS: "auto"},
		DRAM: DRAM{PageSize: 4 << 10, Policy: policy.DefaultDRAM, HighWatermark: 0.95, LowWatermark: 0.85},
		SSD: SSD{Enabled: true, Policy: policy.DefaultSSD, AdmitMinSeen: 1, FileMinSize: 64 << 10,
			OpenFiles: 4096, RecordCache: 1 << 16, ReadAhead: 32 << 20,
			HighWatermark: 0.95, LowWatermark: 0.85},
		Cluster: Cluster{RaftAddr: "127.0.0.1:7072", HeartbeatInterval: 500 * time.Millisecond, LivenessTimeout: 5 * time.Second, ReconcileInterval: time.Minute},
		S3: S3{Bucket: "kvstrata", Region: "us-east-1", CreateBucket: true, Policy: policy.DefaultS3, PromoteTo: "dram",
			SegmentSize: 64 << 20, FlushInterval: time.Second, MaxPending: 256 << 20, Concurrency: 16,
			GarbageAge: time.Hour, ProbeTimeout: time.Second},
		Limits: Limits{
			MaxBlockSize: 4 << 20, MaxBatchBlocks: 1024,
			MaxBatchBytes: 256 << 20, MaxConnections: 1024,
			RequestTimeout: 10 * time.Second, MinRequestRate: 1 << 20,
			MaxValueSize: 512 << 20, MaxPendingRESPBytes: 1536 << 20,
		},
		FetchConcurrency: 16,
		Transport:        "tcp",
		LogLevel:         "info",
		LogFormat:        "text",
		ShutdownTimeout:  30 * time.Second,
		TLS:              TLS{ClientAuth: "optional"},
	}
}

// Transports lists the data-plane backends this binary was built with; the
// daemon extends it.
var Transports = []string{"tcp"}

// Validate reports every problem with c in one error, one line each.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if c.NodeID == 0 {
		bad("node-id must be > 0")
	}
	if c.DataDir == "" {
		bad("data-dir is empty")
	}
	if c.Listen.GRPC == "" {
		bad("listen.grpc is empty: the control plane cannot be turned off")
	}
	for _, a := range []struct{ name, addr string }{
		{"listen.grpc", c.Listen.GRPC}, {"listen.data", c.Listen.Data},
		{"listen.resp", c.Listen.RESP}, {"listen.http", c.Listen.HTTP},
	} {
		if a.addr == "" {
			continue
		}
		if err := checkAddr(a.addr, true); err != nil {
			bad("%s %q %v", a.name, a.addr, err)
		}
	}
	if c.DRAM.Capacity < 0 {
		bad("dram.capacity %d is negative", c.DRAM.Capacity)
	}
	if ps := c.DRAM.PageSize; ps < 512 || ps > 1<<20 || ps&(ps-1) != 0 {
		bad("dram.page-size %v must be a power of two from 512B to 1MiB", ps)
	} else if c.DRAM.Capacity/ps >= 1<<32 {
		bad("dram.capacity %v is 2^32 pages of dram.page-size %v or more: raise the page size", c.DRAM.Capacity, ps)
	}
	if err := machineHolds(c.DRAM.Capacity); err != nil {
		bad("dram.capacity %v (%d bytes) %v", c.DRAM.Capacity, c.DRAM.Capacity, err)
	}
	checkTier := func(name, pol string, hi, lo float64) {
		if !policy.Valid(pol) {
			bad("%s.policy %q is unknown (want %s)", name, pol, strings.Join(policy.Names, ", "))
		}
		// Written so that NaN fails too.
		if !(hi > 0 && hi <= 1) {
			bad("%s.high-watermark %v outside (0, 1]", name, hi)
		}
		if !(lo > 0 && lo <= hi) {
			bad("%s.low-watermark %v outside (0, high-watermark]", name, lo)
		}
	}
	checkTier("dram", c.DRAM.Policy, c.DRAM.HighWatermark, c.DRAM.LowWatermark)
	switch h := c.HBM; {
	case h.Capacity < 0:
		bad("hbm.capacity %d is negative", h.Capacity)
	case h.Capacity > 0 && !HBMBuilt:
		bad("hbm.capacity is %v, but this binary was built without the HBM tier: build it with the cuda tag (make build-cuda)", h.Capacity)
	case h.Capacity > 0:
		checkTier("hbm", h.Policy, h.HighWatermark, h.LowWatermark)
		if ps := h.PageSize; ps < 4<<10 || ps > 2<<20 || ps&(ps-1) != 0 {
			bad("hbm.page-size %v must be a power of two from 4KiB to 2MiB", ps)
		}
		if h.Device < 0 {
			bad("hbm.device %d is negative", h.Device)
		}
		if h.GDS != "auto" && h.GDS != "staged" && h.GDS != "off" {
			bad("hbm.gds %q is not auto, staged or off", h.GDS)
		}
		if h.Capacity < c.Limits.MaxBlockSize {
			bad("hbm.capacity %v is below limits.max-block-size %v", h.Capacity, c.Limits.MaxBlockSize)
		}
	}
	if c.SSD.Enabled {
		checkTier("ssd", c.SSD.Policy, c.SSD.HighWatermark, c.SSD.LowWatermark)
		if c.SSD.Capacity < 0 {
			bad("ssd.capacity %d is negative", c.SSD.Capacity)
		}
		if c.SSD.AdmitMinSeen < 1 || c.SSD.AdmitMinSeen > 15 {
			bad("ssd.admit-min-seen %d outside [1, 15]", c.SSD.AdmitMinSeen)
		}
		if c.SSD.FileMinSize <= 0 {
			bad("ssd.file-min-size %v must be above 0 (above limits.max-block-size keeps every block inside Pebble)", c.SSD.FileMinSize)
		}
		if c.SSD.OpenFiles < 0 {
			bad("ssd.open-files %d is negative (0 keeps no file open)", c.SSD.OpenFiles)
		}
		if c.SSD.RecordCache < 0 || c.SSD.RecordCache > maxRecordCache {
			bad("ssd.record-cache %d is out of range: 0 (no record kept in memory) to %d (1 GiB)", c.SSD.RecordCache, maxRecordCache)
		}
		if c.SSD.ReadAhead <= 0 {
			bad("ssd.read-ahead %v must be above 0", c.SSD.ReadAhead)
		}
	}
	if c.S3.Endpoint != "" {
		if err := checkAddr(c.S3.Endpoint, false); err != nil {
			bad("s3.endpoint %q %v (no scheme: use s3.secure for TLS)", c.S3.Endpoint, err)
		}
		if n := len(c.S3.Bucket); n < 3 || n > 63 || strings.ToLower(c.S3.Bucket) != c.S3.Bucket || strings.ContainsAny(c.S3.Bucket, "/_ ") {
			bad("s3.bucket %q is not a valid bucket name (3-63 lower-case letters, digits, dots, dashes)", c.S3.Bucket)
		}
		if _, err := c.S3.PromoteKinds(c.SSD.Enabled); err != nil {
			bad("%v", err)
		}
		if !policy.Valid(c.S3.Policy) {
			bad("s3.policy %q is unknown (want %s)", c.S3.Policy, strings.Join(policy.Names, ", "))
		}
		if c.S3.Capacity < 0 || c.S3.SegmentSize < 1<<20 || c.S3.SegmentSize > 4<<30 {
			bad("s3.capacity must be ≥ 0 and s3.segment-size in [1MiB, 4GiB]")
		}
		if c.S3.MaxPending < c.S3.SegmentSize {
			bad("s3.max-pending %v is below s3.segment-size %v", c.S3.MaxPending, c.S3.SegmentSize)
		}
		if c.S3.FlushInterval <= 0 || c.S3.Concurrency < 1 || c.S3.Concurrency > 1024 {
			bad("s3.flush-interval must be > 0 and s3.concurrency in [1, 1024]")
		}
		if c.S3.GarbageAge < 0 {
			bad("s3.garbage-age %v is negative (0 never deletes)", c.S3.GarbageAge)
		}
		if c.S3.ProbeTimeout <= 0 {
			bad("s3.probe-timeout %v is not positive", c.S3.ProbeTimeout)
		}
		if (c.S3.AccessKey == "") != (c.S3.SecretKey == "") {
			bad("s3.access-key and s3.secret-key must be set together (or both left to AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
		}
	}
	if err := checkAddr(c.Cluster.RaftAddr, false); err != nil {
		bad("cluster.raft-addr %q %v (its peers dial it)", c.Cluster.RaftAddr, err)
	}
	c.checkAdvertise(bad)
	c.checkSecurity(bad)
	if c.Cluster.Bootstrap != "" && c.Cluster.Join != "" {
		bad("cluster.bootstrap and cluster.join exclude each other: a new node either starts a cluster or joins one")
	}
	if c.Cluster.Bootstrap != "" {
		peers, err := ParsePeers(c.Cluster.Bootstrap)
		switch {
		case err != nil:
			bad("cluster.bootstrap: %v", err)
		case !slices.ContainsFunc(peers, func(p Peer) bool { return p.ID == c.NodeID }):
			bad("cluster.bootstrap %q does not list this node (node-id %d)", c.Cluster.Bootstrap, c.NodeID)
		}
	}
	if c.Cluster.Join != "" {
		if err := checkAddr(c.Cluster.Join, false); err != nil {
			bad("cluster.join %q %v (a member's gRPC address)", c.Cluster.Join, err)
		}
	}
	if _, err := ParseSkipEntries(c.Cluster.SkipEntries); err != nil {
		bad("cluster.skip-entries: %v", err)
	}
	if c.Cluster.ReconcileInterval < 0 {
		bad("cluster.reconcile-interval %v is negative (0 turns reconciling off)", c.Cluster.ReconcileInterval)
	}
	if c.Cluster.HeartbeatInterval <= 0 || c.Cluster.LivenessTimeout < 2*c.Cluster.HeartbeatInterval {
		bad("cluster.liveness-timeout %v must be at least twice cluster.heartbeat-interval %v (> 0)", c.Cluster.LivenessTimeout, c.Cluster.HeartbeatInterval)
	}
	l := c.Limits
	if l.MaxBlockSize <= 0 || l.MaxBlockSize > 1<<31 {
		bad("limits.max-block-size %v outside (0, 2GiB]", l.MaxBlockSize)
	}
	if c.DRAM.Capacity > 0 && c.DRAM.Capacity < l.MaxBlockSize {
		bad("dram.capacity %v is below limits.max-block-size %v", c.DRAM.Capacity, l.MaxBlockSize)
	}
	if l.MaxBatchBlocks < 1 {
		bad("limits.max-batch-blocks %d must be ≥ 1", l.MaxBatchBlocks)
	}
	if l.MaxBatchBytes < l.MaxBlockSize {
		bad("limits.max-batch-bytes %v is below limits.max-block-size %v", l.MaxBatchBytes, l.MaxBlockSize)
	}
	if l.MaxConnections < 1 {
		bad("limits.max-connections %d must be ≥ 1", l.MaxConnections)
	}
	if l.RequestTimeout <= 0 {
		bad("limits.request-timeout %v must be > 0", l.RequestTimeout)
	}
	if l.MinRequestRate <= 0 {
		bad("limits.min-request-rate %v must be > 0", l.MinRequestRate)
	}
	if l.MaxValueSize <= 0 || l.MaxValueSize > 1<<30 {
		bad("limits.max-value-size %v outside (0, 1GiB]", l.MaxValueSize)
	}
	if minResp := max(2*l.MaxValueSize+RESPCommandSlack, 2*l.MaxBlockSize, 16<<20); l.MaxPendingRESPBytes < minResp {
		bad("limits.max-pending-resp-bytes %v is below %v (twice limits.max-value-size plus 1MiB, twice limits.max-block-size, and at least 16MiB)", l.MaxPendingRESPBytes, minResp)
	}
	if l.MaxPendingPutBytes != 0 && l.MaxPendingPutBytes < l.MaxBlockSize {
		bad("limits.max-pending-put-bytes %v is below limits.max-block-size %v", l.MaxPendingPutBytes, l.MaxBlockSize)
	}
	if c.FetchConcurrency < 1 || c.FetchConcurrency > 1024 {
		bad("fetch-concurrency %d outside [1, 1024]", c.FetchConcurrency)
	}
	if !slices.Contains(Transports, c.Transport) {
		if c.Transport == "ucx" {
			bad("transport ucx: this binary was built without UCX support; build it with `make build-ucx` (needs libucx-dev)")
		} else {
			bad("transport %q is unknown (this binary has %s)", c.Transport, strings.Join(Transports, ", "))
		}
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		bad("log-level %q is unknown (want debug, info, warn or error)", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log-format %q is unknown (want text or json)", c.LogFormat)
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown-timeout %v must be > 0", c.ShutdownTimeout)
	}
	for _, s := range c.Settings() {
		if !utf8.ValidString(s.Value()) {
			bad("%s %q is not valid UTF-8", s.Key, s.Value())
		}
	}
	if len(probs) == 0 {
		return nil
	}
	return &Error{Problems: probs}
}

// checkAddr says what is wrong with addr as host:port, if anything. The
// port is a number in [1, 65535] or a service name; listen allows 0 (any
// free port), which an address others dial cannot be.
func checkAddr(addr string, listen bool) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("is not host:port")
	}
	n, err := strconv.ParseUint(port, 10, 64)
	switch {
	case err == nil && n > 65535:
		return fmt.Errorf("has port %d, over 65535", n)
	case err == nil && n == 0 && !listen:
		return errors.New("has port 0, which cannot be dialled")
	case err == nil:
		return nil
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("has port %q, neither a number nor a known service", port)
	}
	return nil
}

// Error lists every problem found in a configuration.
type Error struct{ Problems []string }

func (e *Error) Error() string {
	return "invalid configuration:\n  " + strings.Join(e.Problems, "\n  ")
}

// PromoteKinds returns the tiers s3.promote-to names, fastest first; ssd
// only where the node has an SSD tier.
func (s S3) PromoteKinds(ssd bool) ([]index.TierKind, error) {
	var out []index.TierKind
	for _, name := range strings.Split(s.PromoteTo, ",") {
		switch name = strings.TrimSpace(name); name {
		case "dram":
			out = append(out, index.TierDRAM)
		case "ssd":
			if !ssd {
				return nil, fmt.Errorf("s3.promote-to %q names ssd, and ssd.enabled is false", s.PromoteTo)
			}
			out = append(out, index.TierSSD)
		default:
			return nil, fmt.Errorf("s3.promote-to %q: %q is not dram or ssd (want dram, ssd or dram,ssd)", s.PromoteTo, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
