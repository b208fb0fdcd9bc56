package resp

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// defaultSections are what INFO without arguments reports; "all" and
// "everything" add commandstats.
var defaultSections = []string{"server", "clients", "memory", "stats", "keyspace"}

// lineBreaks takes line breaks out of a Store's INFO fields.
var lineBreaks = strings.NewReplacer("\r", " ", "\n", " ")

// infoSection is one "# Title" block of INFO.
type infoSection struct {
	name  string
	lines []string
}

// infoText builds the reply to INFO [section …] for connection c: the
// server's sections with the Store's fields appended, then the Store's
// own sections. Unknown section names are ignored, as Redis does.
func (s *Server) infoText(c *conn, args [][]byte) string {
	want := map[string]bool{}
	all, defaults := false, len(args) == 0
	for _, a := range args {
		switch name := strings.ToLower(string(a)); name {
		case "all", "everything":
			all = true
		case "default":
			defaults = true
		default:
			want[name] = true
		}
	}
	wanted := func(name string, isDefault bool) bool {
		return all || want[name] || (defaults && isDefault)
	}

	sections := []*infoSection{
		{name: "server"}, {name: "clients"}, {name: "memory"}, {name: "stats"}, {name: "cluster"}, {name: "keyspace"}, {name: "commandstats"},
	}
	byName := map[string]*infoSection{}
	for _, sec := range sections {
		byName[sec.name] = sec
	}
	s.serverInfo(c, byName)
	byName["cluster"].lines = append(byName["cluster"].lines, clusterInfoLines...)
	for _, f := range s.store.Info(c.direct.ctx) {
		name := strings.ToLower(f.Section)
		sec := byName[name]
		if sec == nil {
			sec = &infoSection{name: name}
			byName[name] = sec
			sections = append(sections, sec)
		}
		sec.set(f.Name, f.Value)
	}

	var b strings.Builder
	for _, sec := range sections {
		isDefault := sec.name != "commandstats"
		if !wanted(sec.name, isDefault) {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString("# " + strings.ToUpper(sec.name[:1]) + sec.name[1:] + "\r\n")
		for _, l := range sec.lines {
			b.WriteString(lineBreaks.Replace(l) + "\r\n")
		}
	}
	return b.String()
}

// set puts the line name:value in sec: in place of the line of that name
// if there is one (a Store's field replaces the server's), else at the
// end. A byte count replaced replaces its "_human" twin as well.
func (sec *infoSection) set(name, value string) {
	i := sec.find(name)
	if i < 0 {
		sec.lines = append(sec.lines, name+":"+value)
		return
	}
	sec.lines[i] = name + ":" + value
	if h := sec.find(name + "_human"); h >= 0 {
		if n, err := strconv.ParseUint(value, 10, 64); err == nil {
			sec.lines[h] = name + "_human:" + humanBytes(n)
		}
	}
}

// find returns the index of sec's line named name, or -1.
func (sec *infoSection) find(name string) int {
	for i, l := range sec.lines {
		if len(l) > len(name) && l[len(name)] == ':' && l[:len(name)] == name {
			return i
		}
	}
	return -1
}

// infoValue is the value of the Store's INFO field section.name, or "".
func (s *Server) infoValue(section, name string) string {
	for _, f := range s.store.Info(s.ctx) {
		if strings.EqualFold(f.Section, section) && f.Name == name {
			return f.Value
		}
	}
	return ""
}

// serverInfo fills the server's own sections.
func (s *Server) serverInfo(c *conn, secs map[string]*infoSection) {
	add := func(section, name string, value any) {
		secs[section].lines = append(secs[section].lines, fmt.Sprintf("%s:%v", name, value))
	}
	uptime := time.Since(s.start)
	port := ""
	if a, ok := c.nc.LocalAddr().(*net.TCPAddr); ok {
		port = strconv.Itoa(a.Port)
	}
	add("server", "redis_version", RedisVersion)
	add("server", "redis_mode", "standalone")
	add("server", "kvstrata_version", s.cfg.Version)
	add("server", "os", runtime.GOOS+" "+runtime.GOARCH)
	add("server", "arch_bits", strconv.IntSize)
	add("server", "go_version", runtime.Version())
	add("server", "process_id", os.Getpid())
	add("server", "run_id", s.runID)
	add("server", "tcp_port", port)
	add("server", "uptime_in_seconds", int64(uptime.Seconds()))
	add("server", "uptime_in_days", int64(uptime.Hours()/24))

	add("clients", "connected_clients", s.clientCount())
	add("clients", "maxclients", s.cfg.MaxClients)
	add("clients", "blocked_clients", 0)

	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	add("memory", "used_memory", ms.HeapAlloc)
	add("memory", "used_memory_human", humanBytes(ms.HeapAlloc))
	add("memory", "used_memory_rss", ms.Sys)
	add("memory", "used_memory_rss_human", humanBytes(ms.Sys))
	add("memory", "maxmemory", 0)
	add("memory", "maxmemory_human", "0B")

	st := &s.st
	add("stats", "total_connections_received", st.accepted.Load())
	add("stats", "total_commands_processed", st.commandsProcessed.Load())
	add("stats", "total_net_input_bytes", st.netIn.Load())
	add("stats", "total_net_output_bytes", st.netOut.Load())
	add("stats", "rejected_connections", st.rejected.Load())
	add("stats", "keyspace_hits", st.hits.Load())
	add("stats", "keyspace_misses", st.misses.Load())
	add("stats", "total_error_replies", st.errorReplies.Load())
	add("stats", "unknown_commands", st.unknown.Load())
	add("stats", "protocol_errors", st.protocolErrors.Load())
	add("stats", "idle_clients_closed", st.idleClosed.Load())
	add("stats", "slow_clients_closed", st.slowClosed.Load())
	add("stats", "evicted_clients", st.evicted.Load())
	add("stats", "busy_clients_closed", st.busyClosed.Load())
	add("memory", "pending_command_bytes", s.pending.inUse())

	if n, err := s.store.Len(c.direct.ctx); err == nil && n > 0 {
		add("keyspace", "db0", fmt.Sprintf("keys=%d,expires=0,avg_ttl=0", n))
	}

	for i, cmd := range s.cmds.list {
		if n := st.calls[i].Load(); n > 0 {
			add("commandstats", "cmdstat_"+cmd.name, fmt.Sprintf("calls=%d", n))
		}
	}
}

// humanBytes formats n as Redis does in INFO: 1.50M, 312.00K, 17B.
func humanBytes(n uint64) string {
	const units = "BKMGTPE"
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%dB", n)
	}
	return fmt.Sprintf("%.2f%c", v, units[i])
}

// newRunID returns the 40 hex digits INFO reports as run_id: random, new
// for every Server, so a client can tell that the server restarted.
func newRunID() string {
	b := make([]byte, 20)
	rand.Read(b)
	return hex.EncodeToString(b)
}
