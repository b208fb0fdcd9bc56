//go:build ucx

package ucx

import (
	"regexp"
	"slices"
	"strings"
)

// Lane is one UCX transport an endpoint uses, as UCX reports it: UCX 1.13
// has no query for an endpoint's transports (ucp_ep_query knows only names
// and socket addresses), so this is read from ucp_ep_print_info.
type Lane struct {
	// Transport is UCX's name for it: "posix", "sysv", "cma", "tcp",
	// "rc_mlx5", "dc_mlx5", "cuda_ipc".
	Transport string
	// Device is the device it runs on: "memory" for shared memory, a
	// network interface ("lo", "eth0") or an RDMA port ("mlx5_0:1").
	Device string
	// Uses are what UCX uses the lane for: "am" (messages), "am_bw" (bulk
	// messages), "rma_bw" (zero-copy rendezvous), "keepalive", "wireup".
	Uses []string
}

// String formats a lane as "posix/memory(am,am_bw)".
func (l Lane) String() string {
	return l.Transport + "/" + l.Device + "(" + strings.Join(l.Uses, ",") + ")"
}

// LaneReporter is what a Conn or Listener of this package also is: it says
// which UCX transports its endpoints use, for stats and logs. Discover it:
//
//	if r, ok := conn.(ucx.LaneReporter); ok { log.Info("data plane", "lanes", ucx.FormatLanes(r.Lanes())) }
type LaneReporter interface {
	Lanes() []Lane
}

var (
	_ LaneReporter = (*conn)(nil)
	_ LaneReporter = (*listener)(nil)
)

// FormatLanes formats lanes for a person: "posix/memory(am,am_bw) cma/memory(rma_bw)".
func FormatLanes(lanes []Lane) string {
	parts := make([]string, len(lanes))
	for i, l := range lanes {
		parts[i] = l.String()
	}
	return strings.Join(parts, " ")
}

var (
	laneLine = regexp.MustCompile(`lane\[\d+\]:\s+(.*)$`)
	indexed  = regexp.MustCompile(`#\d+$`)
	pathNum  = regexp.MustCompile(`\.\d+$`)
)

// parseLanes reads the lanes out of ucp_ep_print_info's text, whose lane
// lines look like
//
//	#   lane[0]:  1:posix/memory.0 md[1]   -> md[1]/posix/sysdev[255] am am_bw#0 keepalive
func parseLanes(info string) []Lane {
	var lanes []Lane
	for _, line := range strings.Split(info, "\n") {
		m := laneLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		fields := strings.Fields(m[1])
		if len(fields) == 0 {
			continue
		}
		var l Lane
		if fields[0] == "cm" { // a connection manager lane: "cm tcp"
			l.Transport, l.Device = "cm", strings.Join(fields[1:], " ")
		} else {
			rsc := fields[0]
			if i := strings.IndexByte(rsc, ':'); i >= 0 && !strings.Contains(rsc[:i], "/") {
				rsc = rsc[i+1:]
			}
			tl, dev, _ := strings.Cut(rsc, "/")
			l.Transport, l.Device = tl, pathNum.ReplaceAllString(dev, "")
			if arrow := slices.Index(fields, "->"); arrow >= 0 && arrow+2 <= len(fields) {
				for _, u := range fields[arrow+2:] {
					l.Uses = append(l.Uses, indexed.ReplaceAllString(u, ""))
				}
			}
		}
		lanes = mergeLanes(lanes, []Lane{l})
	}
	return lanes
}

// mergeLanes adds lanes to into, merging those of one transport and device.
func mergeLanes(into, lanes []Lane) []Lane {
	for _, l := range lanes {
		i := slices.IndexFunc(into, func(x Lane) bool { return x.Transport == l.Transport && x.Device == l.Device })
		if i < 0 {
			into = append(into, Lane{Transport: l.Transport, Device: l.Device, Uses: slices.Clone(l.Uses)})
			continue
		}
		for _, u := range l.Uses {
			if !slices.Contains(into[i].Uses, u) {
				into[i].Uses = append(into[i].Uses, u)
			}
		}
	}
	return into
}
