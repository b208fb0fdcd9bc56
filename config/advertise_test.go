package config

import (
	"errors"
	"strings"
	"testing"
)

// Without advertise settings a node advertises where it listens, with the
// port its listener got for a listen port of 0.
func TestAdvertisedAddrDefaultsToTheListenAddress(t *testing.T) {
	l, err := Load("", noEnv, map[string]string{"listen-resp": "localhost:0"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, bound, want string }{
		{"listen.grpc", "127.0.0.1:7070", "127.0.0.1:7070"},
		{"listen.data", "", "127.0.0.1:7071"},
		{"listen.resp", "127.0.0.1:40123", "localhost:40123"}, // the host as written, the port as bound
		{"cluster.raft-addr", "", "127.0.0.1:7072"},
	} {
		got, err := l.AdvertisedAddr(tc.key, tc.bound)
		if err != nil || got != tc.want {
			t.Errorf("AdvertisedAddr(%s, %q) = %q, %v; want %q", tc.key, tc.bound, got, err, tc.want)
		}
	}
	if _, err := l.AdvertisedAddr("listen.nothing", ""); err == nil {
		t.Error("AdvertisedAddr of an unknown setting: no error")
	}
}

// advertise.host replaces every listen host, wildcard or not, and keeps
// each port; a server's own advertise setting wins over both.
func TestAdvertiseHostAndPerServerAddresses(t *testing.T) {
	flags := map[string]string{
		"listen-grpc": "0.0.0.0:7070", "listen-data": "[::]:7071", "listen-resp": ":6380", "listen-http": "10.1.2.3:0",
		"cluster-raft-addr": "0.0.0.0:7072", "advertise-host": "cache-0.kvstrata-cache.prod.svc.cluster.local",
		"advertise-data": "203.0.113.9:17071",
	}
	l, err := Load("", noEnv, flags)
	if err != nil {
		t.Fatal(err)
	}
	host := "cache-0.kvstrata-cache.prod.svc.cluster.local"
	for _, tc := range []struct{ key, bound, want string }{
		{"listen.grpc", "[::]:7070", host + ":7070"},
		{"listen.data", "[::]:7071", "203.0.113.9:17071"},
		{"listen.resp", "[::]:6380", host + ":6380"},
		{"listen.http", "10.1.2.3:45678", host + ":45678"},
		{"cluster.raft-addr", "", host + ":7072"},
	} {
		got, err := l.AdvertisedAddr(tc.key, tc.bound)
		if err != nil || got != tc.want {
			t.Errorf("AdvertisedAddr(%s, %q) = %q, %v; want %q", tc.key, tc.bound, got, err, tc.want)
		}
	}
}

// A wildcard listen address without an advertise setting is refused, per
// server, naming the setting that fixes it; the per-server setting alone
// is enough.
func TestWildcardListenNeedsAnAdvertiseAddress(t *testing.T) {
	flags := map[string]string{
		"listen-grpc": "0.0.0.0:7070", "listen-data": "[::]:7071", "listen-resp": ":6380", "listen-http": "0.0.0.0:9090",
		"cluster-raft-addr": "0.0.0.0:7072",
	}
	_, err := Load("", noEnv, flags)
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("wildcard listen addresses: %v, want a *config.Error", err)
	}
	for _, key := range []string{"listen.grpc", "listen.data", "listen.resp", "listen.http", "cluster.raft-addr"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("the error does not name %s:\n%v", key, err)
		}
	}
	if !strings.Contains(err.Error(), "set advertise.host (or advertise.raft)") {
		t.Errorf("the error does not say what to set:\n%v", err)
	}
	flags["advertise-grpc"], flags["advertise-data"], flags["advertise-resp"] = "10.0.0.1:7070", "10.0.0.1:7071", "10.0.0.1:6380"
	flags["advertise-http"], flags["advertise-raft"] = "10.0.0.1:9090", "10.0.0.1:7072"
	if _, err := Load("", noEnv, flags); err != nil {
		t.Fatalf("every server advertised: %v", err)
	}
	// A configuration that bypassed Validate still never advertises a
	// wildcard.
	c := Default()
	c.Listen.GRPC = "0.0.0.0:7070"
	if got, err := c.AdvertisedAddr("listen.grpc", "[::]:7070"); !errors.Is(err, ErrWildcard) {
		t.Errorf("AdvertisedAddr of a wildcard = %q, %v; want ErrWildcard", got, err)
	}
}

// Bad advertise values are each reported, and nothing is loaded.
func TestBadAdvertiseValuesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		flags map[string]string
		want  string
	}{
		{map[string]string{"advertise-host": "0.0.0.0"}, `advertise.host "0.0.0.0" names no host others can dial`},
		{map[string]string{"advertise-host": "::"}, `advertise.host "::" names no host`},
		{map[string]string{"advertise-host": "node1:7070"}, `advertise.host "node1:7070" is neither an IP address nor a DNS name`},
		{map[string]string{"advertise-host": "http://node1"}, `advertise.host "http://node1" is neither`},
		{map[string]string{"advertise-host": "node 1"}, `advertise.host "node 1" is neither`},
		{map[string]string{"advertise-grpc": "node1"}, `advertise.grpc "node1" is not host:port`},
		{map[string]string{"advertise-raft": "node1:0"}, `advertise.raft "node1:0" has port 0`},
		{map[string]string{"advertise-data": "node1:99999"}, `advertise.data "node1:99999" has port 99999, over 65535`},
		{map[string]string{"advertise-http": "0.0.0.0:9090"}, `advertise.http "0.0.0.0:9090": its host names no host others can dial`},
		{map[string]string{"advertise-grpc": "-bad-:7070"}, `advertise.grpc "-bad-:7070": its host is neither`},
		{map[string]string{"listen-resp": "", "advertise-resp": "node1:6380"}, `advertise.resp "node1:6380" is set, but listen.resp is empty`},
	} {
		l, err := Load("", noEnv, tc.flags)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error saying %s", tc.flags, err, tc.want)
		}
		if l != nil {
			t.Errorf("%v: a configuration was loaded", tc.flags)
		}
	}
}
