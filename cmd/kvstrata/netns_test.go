package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// netnsNet is a private network for the partition tests: node i (from 1)
// runs in network namespace <name>-i with address 198.18.S.i on a veth
// pair whose other end is on a bridge in the test's own namespace, which
// has 198.18.S.254 on the bridge and so reaches every node. 198.18.0.0/15
// is the range RFC 2544 sets aside for such test networks.
//
// A partition is made of blackhole routes: isolate(i) makes node i and
// every other node route each other's address nowhere, while the test
// process still reaches them all. Only iproute2 is needed (no iptables, no
// traffic-control modules). Everything is removed in t.Cleanup.
type netnsNet struct {
	t      *testing.T
	name   string // prefix of the namespaces and links, unique to the test
	subnet string // "198.18.S"
	n      int
}

// newNetnsNet builds the network for n nodes, or says why it cannot.
func newNetnsNet(t *testing.T, n int) (*netnsNet, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("network namespaces need root (running as uid %d)", os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("network namespaces need the ip command (iproute2): %w", err)
	}
	r := rand.Uint32()
	nn := &netnsNet{t: t, name: fmt.Sprintf("kv%06x", r&0xffffff), subnet: fmt.Sprintf("198.%d.%d", 18+r>>31, r>>24&0x7f), n: n}
	t.Cleanup(nn.remove)
	bridge := nn.name + "b"
	steps := [][]string{
		{"link", "add", bridge, "type", "bridge"},
		{"addr", "add", nn.subnet + ".254/24", "dev", bridge},
		{"link", "set", bridge, "up"},
	}
	for i := 1; i <= n; i++ {
		ns, veth := nn.ns(i), fmt.Sprintf("%sv%d", nn.name, i)
		steps = append(steps,
			[]string{"netns", "add", ns},
			[]string{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"link", "set", veth, "master", bridge, "up"},
			[]string{"-n", ns, "addr", "add", nn.host(i) + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "eth0", "up"},
			[]string{"-n", ns, "link", "set", "lo", "up"},
		)
	}
	for _, args := range steps {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nn, nil
}

// ns is node i's namespace.
func (nn *netnsNet) ns(i int) string { return fmt.Sprintf("%s-%d", nn.name, i) }

// host is node i's address.
func (nn *netnsNet) host(i int) string { return fmt.Sprintf("%s.%d", nn.subnet, i) }

// hosts says where each node runs, for startCluster.
func (nn *netnsNet) hosts() []nodeHost {
	out := make([]nodeHost, nn.n)
	for i := range out {
		out[i] = nodeHost{ip: nn.host(i + 1), prefix: []string{"ip", "netns", "exec", nn.ns(i + 1)}}
	}
	return out
}

// isolate cuts node i off from every other node, both ways.
func (nn *netnsNet) isolate(i int) { nn.routes(i, "add") }

// heal undoes isolate(i).
func (nn *netnsNet) heal(i int) { nn.routes(i, "del") }

func (nn *netnsNet) routes(i int, op string) {
	nn.t.Helper()
	for j := 1; j <= nn.n; j++ {
		if j == i {
			continue
		}
		for _, args := range [][]string{
			{"-n", nn.ns(i), "route", op, "blackhole", nn.host(j) + "/32"},
			{"-n", nn.ns(j), "route", op, "blackhole", nn.host(i) + "/32"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				nn.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
	}
}

// remove deletes the namespaces (and with them the veth pairs) and the
// bridge; what does not exist is skipped.
func (nn *netnsNet) remove() {
	for i := 1; i <= nn.n; i++ {
		_ = exec.Command("ip", "netns", "del", nn.ns(i)).Run()
	}
	_ = exec.Command("ip", "link", "del", nn.name+"b").Run()
}
