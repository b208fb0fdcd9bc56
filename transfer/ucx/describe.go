//go:build ucx

package ucx

import "strings"

// Describe says what the listener's endpoints use underneath, for kvctl
// stats and the logs: its UCX settings and the lanes of its connected
// endpoints ("posix/memory(am,am_bw,keepalive)"), or "no peers yet".
func (l *listener) Describe() string {
	lanes := FormatLanes(l.Lanes())
	if lanes == "" {
		lanes = "no peers yet"
	}
	var kv []string
	for _, s := range l.opts.settings() {
		kv = append(kv, s[0]+"="+s[1])
	}
	settings := strings.Join(kv, " ")
	if settings == "" {
		return lanes
	}
	return lanes + "; " + settings
}
