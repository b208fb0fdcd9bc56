package resp

import (
	"crypto/sha1"
	"encoding/hex"
	"net"
	"strconv"
	"strings"
)

// The Redis Cluster discovery commands: CLUSTER INFO, SLOTS, SHARDS, NODES
// and MYID, READONLY and READWRITE. The server answers them as a cluster
// of one node that owns every slot, at the address the client reached:
// its Store serves every key (a cluster-wide Store fetches other nodes'
// keys itself), so a cluster-mode client (redis-py's RedisCluster,
// go-redis's ClusterClient) sends everything to the node it was given and
// never meets a MOVED or ASK redirection.

// clusterInfoLines are the server's lines of INFO's "# Cluster" section:
// cluster-mode clients (redis-py) look there before asking for the slots.
var clusterInfoLines = []string{"cluster_enabled:1"}

// clusterSlots is the number of hash slots of Redis Cluster.
const clusterSlots = 16384

func clusterCommands() []*command {
	return []*command{
		{name: "cluster", arity: -2, flags: []string{"loading", "stale"}, acl: []string{"@slow"},
			doc: doc{summary: "A container for Redis Cluster commands; the server is a cluster of one node owning every slot, whatever node of kvstrata holds a key.", since: "3.0.0", group: "cluster", complexity: "Depends on subcommand."},
			subs: []*command{
				{name: "cluster|info", arity: 2, run: (*conn).clusterInfo, doc: doc{summary: "Returns information about the state of a node.", since: "3.0.0", group: "cluster", complexity: "O(1)"}},
				{name: "cluster|myid", arity: 2, run: (*conn).clusterMyID, doc: doc{summary: "Returns the ID of a node.", since: "3.0.0", group: "cluster", complexity: "O(1)"}},
				{name: "cluster|nodes", arity: 2, run: (*conn).clusterNodes, doc: doc{summary: "Returns the cluster configuration for a node.", since: "3.0.0", group: "cluster", complexity: "O(N) where N is the total number of Cluster nodes"}},
				{name: "cluster|shards", arity: 2, run: (*conn).clusterShards, doc: doc{summary: "Returns the mapping of cluster slots to shards.", since: "7.0.0", group: "cluster", complexity: "O(N) where N is the total number of cluster nodes"}},
				{name: "cluster|slots", arity: 2, run: (*conn).clusterSlotsCmd, doc: doc{summary: "Returns the mapping of cluster slots to nodes.", since: "3.0.0", group: "cluster", complexity: "O(N) where N is the total number of Cluster nodes"}},
			}},
		{name: "readonly", arity: 1, run: (*conn).ok, flags: []string{"loading", "stale", "fast"}, acl: []string{"@fast", "@connection"},
			doc: doc{summary: "Enables read-only queries for a connection to a Redis Cluster replica node; every node serves reads.", since: "3.0.0", group: "cluster", complexity: "O(1)"}},
		{name: "readwrite", arity: 1, run: (*conn).ok, flags: []string{"loading", "stale", "fast"}, acl: []string{"@fast", "@connection"},
			doc: doc{summary: "Enables read-write queries for a connection to a Redis Cluster node.", since: "3.0.0", group: "cluster", complexity: "O(1)"}},
	}
}

func (c *conn) ok([][]byte) { c.w.simple("OK") }

// clusterSelf is the one node of the cluster the client sees: the address
// it reached, and an ID made of it (40 hex digits, as Redis's).
func (c *conn) clusterSelf() (ip string, port int, id string) {
	addr := c.nc.LocalAddr().String()
	host, p, err := net.SplitHostPort(addr)
	if err == nil {
		ip = host
		port, _ = strconv.Atoi(p)
	}
	sum := sha1.Sum([]byte("kvstrata resp " + addr))
	return ip, port, hex.EncodeToString(sum[:])
}

func (c *conn) clusterInfo([][]byte) {
	lines := []string{"cluster_state:ok", "cluster_slots_assigned:16384", "cluster_slots_ok:16384",
		"cluster_slots_pfail:0", "cluster_slots_fail:0", "cluster_known_nodes:1", "cluster_size:1",
		"cluster_current_epoch:1", "cluster_my_epoch:1"}
	c.w.bulkString(strings.Join(lines, "\r\n") + "\r\n")
}

func (c *conn) clusterMyID([][]byte) {
	_, _, id := c.clusterSelf()
	c.w.bulkString(id)
}

func (c *conn) clusterNodes([][]byte) {
	ip, port, id := c.clusterSelf()
	c.w.bulkString(id + " " + net.JoinHostPort(ip, strconv.Itoa(port)) + "@0 myself,master - 0 0 1 connected 0-" + strconv.Itoa(clusterSlots-1) + "\n")
}

// clusterSlotsCmd answers CLUSTER SLOTS: every slot, served by this node.
func (c *conn) clusterSlotsCmd([][]byte) {
	ip, port, id := c.clusterSelf()
	c.w.array(1)
	c.w.array(3)
	c.w.int(0)
	c.w.int(clusterSlots - 1)
	c.w.array(3)
	c.w.bulkString(ip)
	c.w.int(int64(port))
	c.w.bulkString(id)
}

// clusterShards answers CLUSTER SHARDS: one shard of every slot, this
// node its primary.
func (c *conn) clusterShards([][]byte) {
	ip, port, id := c.clusterSelf()
	c.w.array(1)
	c.w.array(4)
	c.w.bulkString("slots")
	c.w.array(2)
	c.w.int(0)
	c.w.int(clusterSlots - 1)
	c.w.bulkString("nodes")
	c.w.array(1)
	c.w.array(14)
	for _, kv := range []struct {
		k string
		v any
	}{{"id", id}, {"port", int64(port)}, {"ip", ip}, {"endpoint", ip}, {"role", "master"}, {"replication-offset", int64(0)}, {"health", "online"}} {
		c.w.bulkString(kv.k)
		switch v := kv.v.(type) {
		case int64:
			c.w.int(v)
		case string:
			c.w.bulkString(v)
		}
	}
}
