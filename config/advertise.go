package config

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// Advertise holds the addresses the node tells its peers and clients to
// dial — in its member record, the raft configuration and the gRPC Info —
// where they differ from the addresses it listens on: behind NAT, in a
// container or a pod, or listening on every address (0.0.0.0, ::), which
// names no host another machine can dial and is never advertised.
//
// Each server's advertised address is, in this order: its own setting
// (Advertise.GRPC, …), given whole as host:port; Host with the port of its
// listen address (the port the listener got, for a listen port of 0); the
// listen address itself. A wildcard listen address with neither is refused
// by Validate: the node does not guess an address, since a guess on a host
// with several (a second NIC, a VPN, a container bridge) splits a cluster
// in ways that show only later.
type Advertise struct {
	// Host is the host name or IP address others reach every server of
	// the node at, with the ports it listens on. Default empty: each
	// server's listen host.
	Host string
	// GRPC, Data, RESP, HTTP and Raft are one server's advertised
	// host:port, where its port differs from the one it listens on (a
	// port mapping). Default empty: Host, or the listen host, with the
	// listen port.
	GRPC, Data, RESP, HTTP, Raft string
}

// ErrWildcard marks an advertised address that would name every address
// of a host (0.0.0.0, ::) or none: no peer can dial it.
var ErrWildcard = errors.New("names no host others can dial (a wildcard)")

// advertised pairs each server's setting keys, listen address and
// advertised address.
type advertised struct {
	listenKey, key, listen, adv string
}

func (c *Config) advertisedServers() []advertised {
	return []advertised{
		{"listen.grpc", "advertise.grpc", c.Listen.GRPC, c.Advertise.GRPC},
		{"listen.data", "advertise.data", c.Listen.Data, c.Advertise.Data},
		{"listen.resp", "advertise.resp", c.Listen.RESP, c.Advertise.RESP},
		{"listen.http", "advertise.http", c.Listen.HTTP, c.Advertise.HTTP},
		{"cluster.raft-addr", "advertise.raft", c.Cluster.RaftAddr, c.Advertise.Raft},
	}
}

// checkAdvertise reports every problem with the advertise settings, and
// every server that would advertise a wildcard.
func (c *Config) checkAdvertise(bad func(string, ...any)) {
	if h := c.Advertise.Host; h != "" {
		if err := checkHost(h); err != nil {
			bad("advertise.host %q %v", h, err)
		}
	}
	for _, s := range c.advertisedServers() {
		switch {
		case s.adv != "" && s.listen == "":
			bad("%s %q is set, but %s is empty: that server is off", s.key, s.adv, s.listenKey)
		case s.adv != "":
			if err := checkAddr(s.adv, false); err != nil {
				bad("%s %q %v (others dial it)", s.key, s.adv, err)
			} else if host, _, _ := net.SplitHostPort(s.adv); checkHost(host) != nil {
				bad("%s %q: its host %v", s.key, s.adv, checkHost(host))
			}
		case s.listen != "" && c.Advertise.Host == "":
			if host, _, err := net.SplitHostPort(s.listen); err == nil && wildcard(host) {
				bad("%s %q listens on every address, which names no host a peer or client can dial: set advertise.host (or %s)",
					s.listenKey, s.listen, s.key)
			}
		}
	}
}

// AdvertisedAddr returns the address others dial for the server whose
// listen setting is listenKey ("listen.grpc", …, "cluster.raft-addr"),
// bound at bound: the listener's own address, whose port is the one it got
// for a listen port of 0 ("" to take the configured port). It fails with
// ErrWildcard where Validate would have refused the configuration.
func (c *Config) AdvertisedAddr(listenKey, bound string) (string, error) {
	for _, s := range c.advertisedServers() {
		if s.listenKey != listenKey {
			continue
		}
		if s.adv != "" {
			return s.adv, nil
		}
		host, port, err := net.SplitHostPort(s.listen)
		if err != nil {
			return "", fmt.Errorf("config: %s %q is not host:port", listenKey, s.listen)
		}
		if bound != "" {
			if _, p, err := net.SplitHostPort(bound); err == nil {
				port = p
			}
		}
		if c.Advertise.Host != "" {
			host = c.Advertise.Host
		}
		if wildcard(host) {
			return "", fmt.Errorf("config: %s %q: %w: set advertise.host", listenKey, s.listen, ErrWildcard)
		}
		return net.JoinHostPort(host, port), nil
	}
	return "", fmt.Errorf("config: no server listens at setting %q", listenKey)
}

// wildcard reports whether host, of a listen address, means every address
// of the machine: "", 0.0.0.0 or ::.
func wildcard(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// checkHost says what is wrong with host as a host others dial, if
// anything: an IP address that is not a wildcard, or a DNS name.
func checkHost(host string) error {
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() {
			return ErrWildcard
		}
		return nil
	}
	if wildcard(host) {
		return ErrWildcard
	}
	if len(host) > 253 {
		return errors.New("is longer than a DNS name may be (253)")
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("is neither an IP address nor a DNS name (no port, no scheme)")
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return errors.New("is neither an IP address nor a DNS name (no port, no scheme)")
			}
		}
	}
	return nil
}
