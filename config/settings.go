package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Setting binds one field of a Config to its file key, environment variable
// and flag. Values of every layer are parsed by Set.
type Setting struct {
	Key   string // config-file key: "dram.capacity"
	Usage string
	// Bool marks a true/false setting, whose flag may be given without a
	// value (--ssd-wal means --ssd-wal=true).
	Bool bool
	// Secret marks a setting whose value is never printed.
	Secret bool
	// number marks a setting whose value is a number, printed as a TOML
	// number rather than a string.
	number bool
	set    func(string) error
	get    func() string
}

// Flag is the command-line flag of s: "dram-capacity".
func (s *Setting) Flag() string { return strings.ReplaceAll(s.Key, ".", "-") }

// Env is the environment variable of s: "KVSTRATA_DRAM_CAPACITY".
func (s *Setting) Env() string {
	return "KVSTRATA_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(s.Key))
}

// Set parses v into the bound field.
func (s *Setting) Set(v string) error {
	if err := s.set(strings.TrimSpace(v)); err != nil {
		return fmt.Errorf("%s: %w", s.Key, err)
	}
	return nil
}

// Value formats the bound field as Set would read it.
func (s *Setting) Value() string { return s.get() }

// Settings returns the table of c's settings, bound to c's fields.
func (c *Config) Settings() []*Setting {
	return []*Setting{
		uintSetting("node-id", "node id within the cluster", &c.NodeID),
		strSetting("data-dir", "directory for persistent state", &c.DataDir),
		strSetting("listen.grpc", "gRPC control-plane address", &c.Listen.GRPC),
		strSetting("listen.data", "data-plane address (empty: off)", &c.Listen.Data),
		strSetting("listen.resp", "Redis-protocol address (empty: off)", &c.Listen.RESP),
		strSetting("listen.http", "metrics and health address (empty: off)", &c.Listen.HTTP),
		strSetting("listen.resp-tls", "Redis-protocol address over TLS, as Redis's tls-port (empty: off; needs tls.cert-file)", &c.Listen.RESPTLS),
		strSetting("advertise.host", "host name or IP others reach every server of this node at, with its listen ports (empty: each listen host, which must not be 0.0.0.0 or ::)", &c.Advertise.Host),
		strSetting("advertise.grpc", "gRPC address others dial, host:port (empty: advertise.host or the listen host, with listen.grpc's port)", &c.Advertise.GRPC),
		strSetting("advertise.data", "data-plane address others dial (empty: advertise.host or the listen host, with listen.data's port)", &c.Advertise.Data),
		strSetting("advertise.resp", "Redis-protocol address others dial (empty: advertise.host or the listen host, with listen.resp's port)", &c.Advertise.RESP),
		strSetting("advertise.http", "metrics and health address others dial (empty: advertise.host or the listen host, with listen.http's port)", &c.Advertise.HTTP),
		strSetting("advertise.raft", "raft address peers dial (empty: advertise.host or the host of cluster.raft-addr, with its port)", &c.Advertise.Raft),
		sizeSetting("hbm.capacity", "GPU-memory tier size, above DRAM (0: off; needs a binary built with the cuda tag)", &c.HBM.Capacity),
		intSetting("hbm.device", "GPU the HBM tier lives on", &c.HBM.Device),
		sizeSetting("hbm.page-size", "HBM tier allocation unit", &c.HBM.PageSize),
		strSetting("hbm.policy", "HBM eviction policy, as dram.policy", &c.HBM.Policy),
		floatSetting("hbm.high-watermark", "fraction of HBM capacity that starts demotion to DRAM", &c.HBM.HighWatermark),
		floatSetting("hbm.low-watermark", "fraction of HBM capacity demotion stops at", &c.HBM.LowWatermark),
		strSetting("hbm.gds", "how SSD blocks promoted into HBM are read: auto (GPUDirect Storage through cuFile where it loads, else staged), staged (pread into pinned host memory, then DMA) or off", &c.HBM.GDS),
		boolSetting("hbm.gds-trust-disk", "store blocks cuFile read into HBM without checking them against their checksum", &c.HBM.GDSTrustDisk),
		sizeSetting("dram.capacity", "DRAM tier size, e.g. 8GiB (0: a quarter of available memory, ≤ 64GiB)", &c.DRAM.Capacity),
		sizeSetting("dram.page-size", "DRAM arena allocation unit", &c.DRAM.PageSize),
		strSetting("dram.policy", "DRAM eviction policy: lru, lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix or lhd", &c.DRAM.Policy),
		floatSetting("dram.high-watermark", "fraction of DRAM capacity that starts demotion", &c.DRAM.HighWatermark),
		floatSetting("dram.low-watermark", "fraction of DRAM capacity demotion stops at", &c.DRAM.LowWatermark),
		boolSetting("ssd.enabled", "use a local-SSD tier", &c.SSD.Enabled),
		strSetting("ssd.dir", "SSD tier directory (empty: <data-dir>/ssd)", &c.SSD.Dir),
		sizeSetting("ssd.capacity", "SSD tier size (0: a quarter of the free disk space, ≤ 256GiB)", &c.SSD.Capacity),
		strSetting("ssd.policy", "SSD eviction policy: lru, lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix or lhd", &c.SSD.Policy),
		intSetting("ssd.admit-min-seen", "admit DRAM victims to the SSD only if accessed this often", &c.SSD.AdmitMinSeen),
		boolSetting("ssd.admit-by-frequency", "admit DRAM victims to a full SSD only if accessed more often than the block they displace", &c.SSD.AdmitByFrequency),
		floatSetting("ssd.high-watermark", "fraction of SSD capacity that starts eviction", &c.SSD.HighWatermark),
		floatSetting("ssd.low-watermark", "fraction of SSD capacity eviction stops at", &c.SSD.LowWatermark),
		boolSetting("ssd.wal", "write-ahead log: acknowledged blocks survive a crash, at 2x the writes", &c.SSD.WAL),
		sizeSetting("ssd.file-min-size", "smallest SSD block kept in a file of its own, read with one pread (smaller: inside Pebble)", &c.SSD.FileMinSize),
		intSetting("ssd.open-files", "block files of blocks under 512KiB kept open between reads (0: none)", &c.SSD.OpenFiles),
		intSetting("ssd.record-cache", "SSD blocks' metadata records kept in memory, 48 bytes each (0: none)", &c.SSD.RecordCache),
		sizeSetting("ssd.read-ahead", "bytes of block files a chain's read asks the disk for ahead of the blocks it has read", &c.SSD.ReadAhead),
		strSetting("s3.endpoint", "object store host:port (empty: no s3 tier)", &c.S3.Endpoint),
		strSetting("s3.bucket", "bucket of the s3 tier", &c.S3.Bucket),
		strSetting("s3.prefix", "object-name prefix in the bucket", &c.S3.Prefix),
		strSetting("s3.region", "region of the bucket", &c.S3.Region),
		boolSetting("s3.secure", "talk TLS to the object store", &c.S3.Secure),
		strSetting("s3.access-key", "s3 access key (default $AWS_ACCESS_KEY_ID)", &c.S3.AccessKey),
		secretSetting("s3.secret-key", "s3 secret key (default $AWS_SECRET_ACCESS_KEY)", &c.S3.SecretKey),
		boolSetting("s3.create-bucket", "create the bucket if it is missing", &c.S3.CreateBucket),
		boolSetting("s3.require-at-start", "refuse to start when the object store cannot be reached (else start with the s3 tier unavailable)", &c.S3.RequireAtStart),
		sizeSetting("s3.capacity", "s3 tier size (0: unlimited)", &c.S3.Capacity),
		strSetting("s3.policy", "s3 eviction policy: lru, lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix or lhd", &c.S3.Policy),
		strSetting("s3.promote-to", "tiers a hit in the object store is copied into: dram, ssd or dram,ssd", &c.S3.PromoteTo),
		sizeSetting("s3.segment-size", "target size of one segment object", &c.S3.SegmentSize),
		durationSetting("s3.flush-interval", "upload a partly filled segment after this long", &c.S3.FlushInterval),
		sizeSetting("s3.max-pending", "most bytes waiting for upload before ssd victims are dropped", &c.S3.MaxPending),
		intSetting("s3.concurrency", "parallel uploads and ranged gets", &c.S3.Concurrency),
		durationSetting("s3.garbage-age", "delete a data object no index names this long after its upload (0: never)", &c.S3.GarbageAge),
		durationSetting("s3.probe-timeout", "mark the object store unavailable when a read and then a probe of the bucket get no answer for this long each", &c.S3.ProbeTimeout),
		strSetting("cluster.name", "node name for people (default: host name and node id)", &c.Cluster.Name),
		strSetting("cluster.raft-addr", "raft transport address", &c.Cluster.RaftAddr),
		strSetting("cluster.bootstrap", "voters of a new cluster: 1=host:7072,2=host:7072,…", &c.Cluster.Bootstrap),
		strSetting("cluster.join", "gRPC address of a member to join through", &c.Cluster.Join),
		durationSetting("cluster.heartbeat-interval", "how often the node tells the leader it is alive", &c.Cluster.HeartbeatInterval),
		durationSetting("cluster.liveness-timeout", "silence after which the leader marks a node down", &c.Cluster.LivenessTimeout),
		durationSetting("cluster.reconcile-interval", "how often, on average, the node corrects what the directory lists for it from what its tiers hold (0: off)", &c.Cluster.ReconcileInterval),
		strSetting("cluster.skip-entries", "raft log indices of unknown entries to apply as no-ops, 12,34 (same list on every node)", &c.Cluster.SkipEntries),
		sizeSetting("limits.max-block-size", "largest block accepted", &c.Limits.MaxBlockSize),
		intSetting("limits.max-batch-blocks", "most blocks in one request", &c.Limits.MaxBatchBlocks),
		sizeSetting("limits.max-batch-bytes", "most bytes in one put", &c.Limits.MaxBatchBytes),
		intSetting("limits.max-connections", "most data-plane and RESP connections, each", &c.Limits.MaxConnections),
		durationSetting("limits.request-timeout", "a RESP command or data-plane request must arrive within this, plus 1s per limits.min-request-rate bytes of it", &c.Limits.RequestTimeout),
		sizeSetting("limits.min-request-rate", "slowest pace, per second, of a RESP command or data-plane request past limits.request-timeout", &c.Limits.MinRequestRate),
		sizeSetting("limits.max-value-size", "largest value a RESP client may SET; values over limits.max-block-size are kept as several blocks", &c.Limits.MaxValueSize),
		sizeSetting("limits.max-pending-resp-bytes", "most memory all RESP commands still arriving hold together (at least twice limits.max-value-size, plus 1MiB)", &c.Limits.MaxPendingRESPBytes),
		sizeSetting("limits.max-pending-put-bytes", "most DRAM held reserved for data-plane blocks still arriving (0: a quarter of dram.capacity)", &c.Limits.MaxPendingPutBytes),
		intSetting("fetch-concurrency", "a restore's read ahead from the SSD and the object store: fetch-concurrency/4 reads in flight, each of up to 16 blocks (or one segment object); also the blocks a warm reads at once", &c.FetchConcurrency),
		strSetting("transport", "data-plane transport: tcp or ucx", &c.Transport),
		strSetting("ucx.tls", "UCX transports to use, as UCX_TLS takes them (empty: UCX's choice)", &c.UCX.TLS),
		strSetting("ucx.net-devices", "network devices UCX may use, as UCX_NET_DEVICES takes them", &c.UCX.NetDevices),
		strSetting("log-level", "debug, info, warn or error", &c.LogLevel),
		strSetting("log-format", "text or json", &c.LogFormat),
		durationSetting("shutdown-timeout", "how long a graceful shutdown may take", &c.ShutdownTimeout),
		boolSetting("pprof", "serve Go's profiler under /debug/pprof/ on the HTTP address", &c.Pprof),
		strSetting("tls.cert-file", "PEM certificate chain of the node; with it gRPC, HTTP, the data plane and raft speak TLS only (re-read on SIGHUP)", &c.TLS.CertFile),
		strSetting("tls.key-file", "PEM private key of tls.cert-file", &c.TLS.KeyFile),
		strSetting("tls.ca-file", "PEM certificates client and peer certificates must chain to, and the node trusts when it dials peers (empty: the system's roots)", &c.TLS.CAFile),
		strSetting("tls.client-auth", "client certificates: none, optional (verify one if given) or require", &c.TLS.ClientAuth),
		strSetting("auth.users-file", "users, hashed secrets, roles and tenants; with it every port authenticates its clients (re-read on SIGHUP)", &c.Auth.UsersFile),
		strSetting("auth.cluster-token-file", "file holding the secret cluster members present to each other, one a line: the first is presented, each accepted (re-read on SIGHUP)", &c.Auth.ClusterTokenFile),
		boolSetting("insecure.allow-remote", "UNSAFE: listen on non-loopback addresses without TLS and authentication", &c.Insecure.AllowRemote),
	}
}

func strSetting(key, usage string, p *string) *Setting {
	return &Setting{Key: key, Usage: usage,
		set: func(v string) error { *p = v; return nil },
		get: func() string { return *p }}
}

func intSetting(key, usage string, p *int) *Setting {
	return &Setting{Key: key, Usage: usage, number: true,
		set: func(v string) error {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%q is not an integer", v)
			}
			*p = n
			return nil
		},
		get: func() string { return strconv.Itoa(*p) }}
}

func uintSetting(key, usage string, p *uint32) *Setting {
	return &Setting{Key: key, Usage: usage, number: true,
		set: func(v string) error {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return fmt.Errorf("%q is not an integer in [0, 4294967295]", v)
			}
			*p = uint32(n)
			return nil
		},
		get: func() string { return strconv.FormatUint(uint64(*p), 10) }}
}

func floatSetting(key, usage string, p *float64) *Setting {
	return &Setting{Key: key, Usage: usage, number: true,
		set: func(v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				return fmt.Errorf("%q is not a finite number", v)
			}
			*p = f
			return nil
		},
		get: func() string { return strconv.FormatFloat(*p, 'g', -1, 64) }}
}

func boolSetting(key, usage string, p *bool) *Setting {
	return &Setting{Key: key, Usage: usage, Bool: true,
		set: func(v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%q is not true or false", v)
			}
			*p = b
			return nil
		},
		get: func() string { return strconv.FormatBool(*p) }}
}

// secretSetting is a string setting that --print-config masks.
func secretSetting(key, usage string, p *string) *Setting {
	s := strSetting(key, usage, p)
	s.Secret = true
	return s
}

func sizeSetting(key, usage string, p *ByteSize) *Setting {
	return &Setting{Key: key, Usage: usage,
		set: func(v string) error {
			if v == "auto" {
				*p = 0
				return nil
			}
			b, err := ParseByteSize(v)
			if err != nil {
				return err
			}
			*p = b
			return nil
		},
		get: func() string { return p.String() }}
}

func durationSetting(key, usage string, p *time.Duration) *Setting {
	return &Setting{Key: key, Usage: usage,
		set: func(v string) error {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("%q is not a duration like 30s or 2m", v)
			}
			*p = d
			return nil
		},
		get: func() string { return p.String() }}
}
