package resp_test

import (
	"net"
	"testing"
)

// TestClusterDiscoveryNamesOneNodeOwningEverySlot: a cluster-mode client
// that asks any node for the slots finds that node owning all of them,
// at the address it reached.
func TestClusterDiscoveryNamesOneNodeOwningEverySlot(t *testing.T) {
	_, addr := startServer(t, nil, nil)
	host, port, _ := net.SplitHostPort(addr)
	id := `"[0-9a-f]{40}"`
	run(t, dial(t, addr), []step{
		{cmd("CLUSTER SLOTS"), `/^\[\[:0 :16383 \["` + host + `" :` + port + ` ` + id + `\]\]\]$/`},
		{cmd("CLUSTER SHARDS"), `/^\[\["slots" \[:0 :16383\] "nodes" \[\["id" ` + id + ` "port" :` + port + ` "ip" "` + host + `" "endpoint" "` + host + `" "role" "master" "replication-offset" :0 "health" "online"\]\]\]\]$/`},
		{cmd("CLUSTER INFO"), `/^"cluster_state:ok\\r\\ncluster_slots_assigned:16384\\r\\n.*cluster_known_nodes:1\\r\\n.*"$/`},
		{cmd("CLUSTER MYID"), `/^` + id + `$/`},
		{cmd("CLUSTER NODES"), `/^"[0-9a-f]{40} ` + host + `:` + port + `@0 myself,master - 0 0 1 connected 0-16383\\n"$/`},
		{cmd("CLUSTER KEYSLOT k"), "-ERR unknown subcommand 'KEYSLOT'. Try CLUSTER HELP."},
		{cmd("INFO cluster"), `"# Cluster\r\ncluster_enabled:1\r\n"`},
		{cmd("READONLY"), "+OK"},
		{cmd("READWRITE"), "+OK"},
		{cmd("SET k v"), "+OK"},
	})
}
