package metrics

import (
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// How a request ended, as the status label of request_duration_seconds
// says it. Three values keep the histogram's series at most three per
// front end and operation (times the buckets); the reason of a failure is
// the label of request_errors_total instead.
const (
	StatusOK    = "ok"    // served
	StatusMiss  = "miss"  // answered that the block or key is not there
	StatusError = "error" // failed: request_errors_total says why
)

// Reasons of request_errors_total are bounded sets: gRPC's codes
// (grpcReason), the Redis error codes in respReasons, the data plane's
// statuses (api/dataplane). A reason outside its set is counted as
// reasonOther, so that no client can make series by sending odd input.
const reasonOther = "other"

// ObserveStatus records one request of front end api ("grpc", "data",
// "resp"), operation op, that started at start and ended as reason:
// "ok", a miss ("not_found") or the reason it failed. Failures are also
// counted in request_errors_total.
func (m *Metrics) ObserveStatus(api, op, reason string, start time.Time) {
	if m == nil {
		return
	}
	status := StatusError
	switch reason {
	case "ok":
		status = StatusOK
	case "not_found":
		status = StatusMiss
	default:
		m.errors.WithLabelValues(api, op, reason).Inc()
	}
	m.latency.WithLabelValues(api, op, status).Observe(time.Since(start).Seconds())
}

// ObserveRESP records one Redis-protocol command as resp.Config.OnCommand
// reports it: its name, "ok" or the first word of its error reply in
// lower case, and when it started.
func (m *Metrics) ObserveRESP(name, status string, start time.Time) {
	if status != "ok" && !respReasons[status] {
		status = reasonOther
	}
	m.ObserveStatus("resp", name, status, start)
}

// respReasons are the error codes Redis servers reply with (the first
// word of an error reply, lower-cased).
var respReasons = map[string]bool{
	"err": true, "oom": true, "tryagain": true, "wrongtype": true, "noauth": true, "noperm": true,
	"execabort": true, "busy": true, "readonly": true, "loading": true, "noproto": true, "noscript": true,
	"crossslot": true, "moved": true, "ask": true, "clusterdown": true, "masterdown": true, "misconf": true,
}

// ObserveData records one block of the data plane as
// dataplane.Observer reports it: its direction ("in" for a put, "out"
// for a get), its size, when it started, and how it ended ("ok",
// "not_found", or why it failed). Bytes are counted for blocks served.
func (m *Metrics) ObserveData(direction string, bytes int, start time.Time, status string) {
	if m == nil {
		return
	}
	op := "get"
	if direction == "in" {
		op = "put"
	}
	if status == "ok" {
		m.DataBytes(direction, bytes)
	} else if !dataReasons[status] {
		status = reasonOther
	}
	m.ObserveStatus("data", op, status, start)
}

// dataReasons are the statuses api/dataplane reports.
var dataReasons = map[string]bool{"not_found": true, "full": true, "unavailable": true, "refused": true, "corrupt": true, "error": true}

// grpcReason is a gRPC status code as a label: "ok", "not_found",
// "deadline_exceeded", … (one of gRPC's 17 codes).
func grpcReason(c codes.Code) string {
	switch {
	case c == codes.OK:
		return "ok"
	case c > codes.Unauthenticated:
		return reasonOther
	}
	var b strings.Builder
	for i, r := range c.String() {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
