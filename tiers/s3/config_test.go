package s3_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	cfg := s3.Config{
		Endpoint:         "http://localhost:9000",
		Bucket:           "ab",
		Prefix:           "/kv//x/",
		AccessKey:        "only-the-access-key",
		Capacity:         -1,
		MaxBlockSize:     2 << 30,
		SegmentSize:      -1,
		PartSize:         1 << 20,
		FlushInterval:    -time.Second,
		MaxPendingBytes:  -1,
		Concurrency:      5000,
		RequestTimeout:   -1,
		Retries:          1000,
		RetryBackoff:     -1,
		FailureThreshold: -1,
		ProbeInterval:    -1,
		ProbeTimeout:     -1,
		RescanInterval:   -1,
		DeleteDelay:      -1,
		CloseTimeout:     -1,
	}
	cfg.EnsureDefaults()
	err := cfg.Validate()
	if !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("Validate: %v, want ErrInvalidConfig", err)
	}
	for _, field := range []string{
		"Endpoint", "Bucket", "Prefix", "AccessKey and SecretKey", "Capacity", "MaxBlockSize",
		"SegmentSize", "PartSize", "FlushInterval", "MaxPendingBytes", "Concurrency",
		"RequestTimeout", "Retries", "RetryBackoff", "FailureThreshold", "ProbeInterval",
		"ProbeTimeout", "RescanInterval", "DeleteDelay", "CloseTimeout",
	} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("Validate does not report %s: %v", field, err)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "env-access")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
	cfg := s3.Config{Endpoint: "127.0.0.1:9000", Bucket: "kvstrata"}
	cfg.EnsureDefaults()
	must(t, cfg.Validate())
	if cfg.AccessKey != "env-access" || cfg.SecretKey != "env-secret" {
		t.Errorf("credentials not read from the environment: %q, %q", cfg.AccessKey, cfg.SecretKey)
	}
	if cfg.SegmentSize != s3.DefaultSegmentSize || cfg.MaxPendingBytes != 4*s3.DefaultSegmentSize ||
		cfg.FlushInterval != s3.DefaultFlushInterval || cfg.Concurrency != s3.DefaultConcurrency ||
		cfg.MaxBlockSize != s3.DefaultMaxBlockSize || cfg.Retries != s3.DefaultRetries ||
		cfg.ProbeTimeout != s3.DefaultProbeTimeout {
		t.Errorf("defaults: %+v", cfg)
	}
	short := s3.Config{Endpoint: "127.0.0.1:9000", Bucket: "kvstrata", RequestTimeout: 200 * time.Millisecond}
	short.EnsureDefaults()
	if short.ProbeTimeout != short.RequestTimeout {
		t.Errorf("ProbeTimeout defaults to %v with RequestTimeout %v; want RequestTimeout, the shorter", short.ProbeTimeout, short.RequestTimeout)
	}
	slow := s3.Config{Endpoint: "127.0.0.1:9000", Bucket: "kvstrata", RequestTimeout: time.Second, ProbeTimeout: 2 * time.Second}
	slow.EnsureDefaults()
	if err := slow.Validate(); !errors.Is(err, tiers.ErrInvalidConfig) || !strings.Contains(err.Error(), "ProbeTimeout") {
		t.Errorf("ProbeTimeout over RequestTimeout: %v, want it refused", err)
	}
	explicit := s3.Config{Endpoint: "127.0.0.1:9000", Bucket: "kvstrata", AccessKey: "a", SecretKey: "s"}
	explicit.EnsureDefaults()
	if explicit.AccessKey != "a" {
		t.Error("the environment overrode credentials set in the config")
	}
}

func TestOpenRefusesABadConfigWithoutTouchingTheStore(t *testing.T) {
	_, err := s3.Open(context.Background(), s3.Config{Bucket: "kvstrata"})
	if !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("Open without an endpoint: %v, want ErrInvalidConfig", err)
	}
}

func TestOpenOfAMissingBucketFailsUnlessAskedToCreateIt(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("missing")
	cfg.CreateBucket = false
	cfg.Logger = testLogger(t)
	if _, err := s3.Open(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Open of a missing bucket: %v", err)
	}
	cfg.CreateBucket = true
	openTier(t, cfg)
}

func TestOpenWithTheStoreDownFails(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("down")
	cfg.RetryBackoff = time.Millisecond
	cfg.Logger = testLogger(t)
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s3.Open(ctx, cfg); !errors.Is(err, tiers.ErrUnavailable) {
		t.Fatalf("Open with the store down: %v, want ErrUnavailable", err)
	}
}

func TestZeroCapacityIsUnlimited(t *testing.T) {
	srv := s3test.Start(t)
	tr := openTier(t, srv.Config("unlimited"))
	if s := tr.Stats(); s.Capacity != s3.UnlimitedCapacity {
		t.Fatalf("Capacity = %d, want UnlimitedCapacity", s.Capacity)
	}
}
