package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
)

// A cluster whose nodes listen on every address of their own machine (a
// network namespace each) and advertise the address the others reach them
// at: they bootstrap raft through the advertised raft addresses, their
// member records and Info name only advertised addresses, and a read
// through one node fetches blocks from another at its advertised data
// address. Nodes 1 and 2 advertise one host for every port
// (--advertise-host); node 3 listens on [::] and gives each server's
// address whole.
func TestClusterListeningOnWildcardsServesThroughAdvertisedAddresses(t *testing.T) {
	nn, err := newNetnsNet(t, 3)
	if err != nil {
		t.Skipf("no advertise test: %v; it needs root and iproute2's ip netns", err)
	}
	at := func(i, port int) string { return net.JoinHostPort(nn.host(i), strconv.Itoa(port)) }
	var peers []string
	for i := 1; i <= 3; i++ {
		peers = append(peers, fmt.Sprintf("%d=%s", i, at(i, portRaft)))
	}
	nodes := make([]*proc, 3)
	for i := 1; i <= 3; i++ {
		p := &proc{t: t, dir: t.TempDir(), prefix: []string{"ip", "netns", "exec", nn.ns(i)},
			grpc: at(i, portGRPC), resp: at(i, portRESP), http: at(i, portHTTP)}
		wild := "0.0.0.0"
		advertise := []string{"--advertise-host", nn.host(i)}
		if i == 3 {
			wild = "::"
			advertise = []string{"--advertise-grpc", p.grpc, "--advertise-data", at(i, portData), "--advertise-resp", p.resp,
				"--advertise-http", p.http, "--advertise-raft", at(i, portRaft)}
		}
		listen := func(port int) string { return net.JoinHostPort(wild, strconv.Itoa(port)) }
		p.args = append([]string{"serve", "--node-id", strconv.Itoa(i), "--data-dir", p.dir,
			"--dram-capacity", "64MiB", "--ssd-capacity", "512MiB",
			"--listen-grpc", listen(portGRPC), "--listen-data", listen(portData), "--listen-resp", listen(portRESP),
			"--listen-http", listen(portHTTP), "--cluster-raft-addr", listen(portRaft),
			"--cluster-bootstrap", strings.Join(peers, ","),
			// Every address of a network namespace only the test reaches.
			"--insecure-allow-remote"}, advertise...)
		nodes[i-1] = p
		p.launch()
	}
	for _, p := range nodes {
		p.waitReady()
	}
	leaderOf(t, nodes...)

	// Every address a node publishes is its advertised one.
	resp := members(t, nodes[0].api())
	if len(resp.Members) != 3 {
		t.Fatalf("members: %v", resp.Members)
	}
	for _, m := range resp.Members {
		i := int(m.Id)
		if m.GrpcAddr != at(i, portGRPC) || m.DataAddr != at(i, portData) || m.RaftAddr != at(i, portRaft) {
			t.Errorf("member %d publishes grpc %s, data %s, raft %s; want %s, %s, %s", i,
				m.GrpcAddr, m.DataAddr, m.RaftAddr, at(i, portGRPC), at(i, portData), at(i, portRaft))
		}
	}
	for i, p := range nodes {
		info := p.api().Info()
		if info.DataAddr != at(i+1, portData) || info.RespAddr != p.resp || info.HttpAddr != p.http {
			t.Errorf("node %d's Info: data %s, resp %s, http %s; want %s, %s, %s", i+1,
				info.DataAddr, info.RespAddr, info.HttpAddr, at(i+1, portData), p.resp, p.http)
		}
	}

	// Blocks put on node 2 (over its advertised data plane) are read
	// through node 1, which fetches them from node 2 at the address node 2
	// advertised.
	keys := putBlocks(t, nodes[1].api(), 7, 0, 16, 32<<10)
	if err := syncNode(nodes[1].api(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "node 1's directory lists node 2's blocks", func() bool {
		return allLocatedAt(t, nodes[0].api(), keys, 2)
	})
	c := client.NewClusterClient(nodes[0].api(), client.Options{})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.Get(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Found || string(r.Data) != string(blockData(int(keys[i].Hash), 32<<10)) {
			t.Fatalf("block %v read through node 1: found %v, or its bytes differ", keys[i], r.Found)
		}
	}

	// The Redis protocol answers at node 3's advertised address.
	if _, err := exec.LookPath("redis-cli"); err == nil {
		host, port, _ := net.SplitHostPort(nodes[2].resp)
		out, err := exec.Command("redis-cli", "-h", host, "-p", port, "SET", "advertised", "yes").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "OK" {
			t.Fatalf("redis-cli SET at %s: %v: %s", nodes[2].resp, err, out)
		}
		out, err = exec.Command("redis-cli", "-h", host, "-p", port, "GET", "advertised").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "yes" {
			t.Fatalf("redis-cli GET at %s: %v: %s", nodes[2].resp, err, out)
		}
	}
}

// A node told to listen on every address and advertise nothing refuses to
// start, saying which setting to give; a bad advertise address is a usage
// error too.
func TestWildcardListenWithoutAdvertiseIsAUsageError(t *testing.T) {
	dir := t.TempDir()
	usageErrorSays(t, []string{"serve", "--data-dir", dir, "--listen-grpc", "0.0.0.0:0", "--listen-data", "", "--listen-resp", "",
		"--listen-http", "", "--cluster-raft-addr", "0.0.0.0:7072"},
		`listen.grpc "0.0.0.0:0" listens on every address`, "set advertise.host (or advertise.grpc)",
		`cluster.raft-addr "0.0.0.0:7072" listens on every address`)
	usageErrorSays(t, []string{"serve", "--data-dir", dir, "--advertise-host", "node1:7070", "--advertise-raft", "0.0.0.0:7072"},
		`advertise.host "node1:7070" is neither an IP address nor a DNS name`, `advertise.raft "0.0.0.0:7072": its host names no host`)
}
