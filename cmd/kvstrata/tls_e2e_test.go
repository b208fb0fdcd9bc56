package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/internal/tlsfiles/tlstest"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// tlsNode is a node that speaks TLS on every port, and what the test
// knows of it.
type tlsNode struct {
	*proc
	dir                 string // its certificates
	ca                  *tlstest.CA
	cert                tlstest.Pair // the node's
	data, respTLS, raft string
}

// startTLSNode starts a node with a certificate the test's CA issued,
// tls.client-auth clientAuth, the Redis protocol over TLS beside the plain
// one, and extra flags; the test's clients present a certificate of the
// same CA.
func startTLSNode(t *testing.T, clientAuth string, extra ...string) *tlsNode {
	t.Helper()
	dir := t.TempDir()
	n := &tlsNode{dir: dir, ca: tlstest.NewCA(t, dir, "ca"), data: freeport.Addr(t), respTLS: freeport.Addr(t), raft: freeport.Addr(t)}
	n.cert = n.ca.Issue(t, dir, "node")
	user := n.ca.Issue(t, dir, "user")
	n.proc = &proc{t: t, dir: t.TempDir(), grpc: freeport.Addr(t), resp: freeport.Addr(t), http: freeport.Addr(t)}
	n.args = append([]string{"serve", "--data-dir", n.proc.dir, "--dram-capacity", "64MiB", "--ssd-capacity", "512MiB",
		"--listen-grpc", n.grpc, "--listen-data", n.data, "--listen-resp", n.resp, "--listen-http", n.http,
		"--listen-resp-tls", n.respTLS, "--cluster-raft-addr", n.raft,
		"--tls-cert-file", n.cert.CertFile, "--tls-key-file", n.cert.KeyFile, "--tls-ca-file", n.ca.CAFile,
		"--tls-client-auth", clientAuth}, extra...)
	n.tls = n.clientTLS(t, user)
	n.start()
	return n
}

// clientTLS is a client config that trusts the node's CA and presents
// pair (none when pair is zero).
func (n *tlsNode) clientTLS(t *testing.T, pair tlstest.Pair) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(n.ca.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("CA file: %v", err)
	}
	c := &tls.Config{RootCAs: pool}
	if pair.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c
}

// servedSerial opens a new TLS connection to addr and returns the serial
// of the certificate the node presented.
func servedSerial(addr string, conf *tls.Config) (string, error) {
	conf = conf.Clone()
	conf.NextProtos = []string{"h2", "http/1.1"}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, conf)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// Every port speaks TLS with the certificate from the files, and the real
// clients — redis-cli, grpcurl, curl, the Go client — get in with the CA
// and a client certificate; without one, with one another CA issued, or
// in plaintext, they do not.
func TestEveryPortSpeaksTLSToRealClients(t *testing.T) {
	t.Parallel()
	n := startTLSNode(t, "require")
	user := filepath.Join(n.dir, "user")
	host, port, _ := net.SplitHostPort(n.respTLS)

	// redis-cli --tls on listen.resp-tls.
	redis := func(extra ...string) (string, error) {
		return run(t, "redis-cli", append([]string{"--tls", "--cacert", n.ca.CAFile, "-h", host, "-p", port}, extra...)...)
	}
	if out, err := redis("--cert", user+".pem", "--key", user+"-key.pem", "SET", "greeting", "hello over tls"); err != nil || strings.TrimSpace(out) != "OK" {
		t.Fatalf("redis-cli --tls SET: %v: %s", err, out)
	}
	if out, err := redis("--cert", user+".pem", "--key", user+"-key.pem", "GET", "greeting"); err != nil || strings.TrimSpace(out) != "hello over tls" {
		t.Fatalf("redis-cli --tls GET: %v: %s", err, out)
	}
	if out, _ := redis("GET", "greeting"); strings.Contains(out, "hello over tls") {
		t.Fatalf("redis-cli without a client certificate read a value of a node that requires one: %s", out)
	}
	// listen.resp stays plain, as Redis's port beside its tls-port.
	rh, rp, _ := net.SplitHostPort(n.resp)
	if out, err := run(t, "redis-cli", "-h", rh, "-p", rp, "GET", "greeting"); err != nil || strings.TrimSpace(out) != "hello over tls" {
		t.Fatalf("plain redis-cli on listen.resp: %v: %s", err, out)
	}

	// grpcurl with the CA and a client certificate.
	grpcurl := func(extra ...string) (string, error) {
		return run(t, "grpcurl", append(extra, n.grpc, "grpc.health.v1.Health/Check")...)
	}
	if out, err := grpcurl("-cacert", n.ca.CAFile, "-cert", user+".pem", "-key", user+"-key.pem"); err != nil || !strings.Contains(out, "SERVING") {
		t.Fatalf("grpcurl -cacert -cert -key: %v: %s", err, out)
	}
	if out, err := grpcurl("-cacert", n.ca.CAFile); err == nil {
		t.Fatalf("grpcurl without a client certificate got in: %s", out)
	}
	if out, err := grpcurl("-plaintext"); err == nil {
		t.Fatalf("grpcurl -plaintext got in: %s", out)
	}

	// curl to /metrics over TLS.
	if out, err := run(t, "curl", "-sS", "--fail", "--cacert", n.ca.CAFile, "--cert", user+".pem", "--key", user+"-key.pem",
		"https://"+n.http+"/metrics"); err != nil || !strings.Contains(out, "kvstrata_") {
		t.Fatalf("curl https /metrics: %v: %.300s", err, out)
	}
	if out, err := run(t, "curl", "-sS", "--fail", "http://"+n.http+"/metrics"); err == nil || strings.Contains(out, "kvstrata_") {
		t.Fatalf("curl over plain HTTP read the metrics: %v: %.300s", err, out)
	}

	// The Go client: gRPC and the data plane over TLS.
	c := n.api()
	if c.DataPlane() != "tcp" {
		t.Fatalf("the client moves blocks over %s, want the tcp data plane", c.DataPlane())
	}
	keys := putBlocks(t, c, 7, 0, 4, 64<<10)
	if got := fetchedCount(t, c, keys); got != len(keys) {
		t.Fatalf("fetched %d of %d blocks over the TLS data plane", got, len(keys))
	}

	// A client certificate another CA issued is refused on every port.
	intruder := tlstest.NewCA(t, n.dir, "stranger").Issue(t, n.dir, "intruder")
	bad := n.clientTLS(t, intruder)
	for _, addr := range []string{n.grpc, n.data, n.respTLS, n.http, n.raft} {
		if err := talkTLS(addr, bad); err == nil {
			t.Errorf("%s let in a client certificate that does not chain to tls.ca-file", addr)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if c, err := client.Dial(ctx, n.grpc, client.Options{TLS: bad, RetryBudget: time.Millisecond}); err == nil {
		c.Close()
		t.Error("the Go client got in with a certificate of another CA")
	}

	// Plaintext gets nothing out of any TLS port.
	for _, addr := range []string{n.grpc, n.data, n.respTLS, n.http, n.raft} {
		if reply := plaintextReply(t, addr); reply != "" {
			t.Errorf("%s answered a plaintext client: %q", addr, reply)
		}
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	if conn, err := tcp.New(tcp.Options{}).Dial(ctx2, n.data); err == nil {
		conn.Close()
		t.Error("a plaintext data-plane client completed its handshake")
	}
}

// talkTLS completes a TLS handshake with addr as conf says and reads: a
// server that refuses the client's certificate fails one or the other.
func talkTLS(addr string, conf *tls.Config) error {
	conf = conf.Clone()
	conf.NextProtos = []string{"h2"}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, conf)
	if err != nil {
		return err
	}
	defer c.Close()
	// TLS 1.3 reports the server's refusal of the certificate on the
	// first read.
	c.SetDeadline(time.Now().Add(2 * time.Second))
	c.Write([]byte("PING\r\n"))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil // let in, and waiting for a request it understands
	}
	return err
}

// plaintextReply sends a plaintext request to addr and returns what came
// back that a plaintext client could use; "" for nothing (a closed
// connection, a TLS alert, or HTTP's "this is an HTTPS server").
func plaintextReply(t *testing.T, addr string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nPING\r\nKVST\x01\x00\x00\x00"))
	b, _ := io.ReadAll(bufio.NewReader(c))
	s := string(b)
	switch {
	case s == "", s[0] == 0x15: // nothing, or a TLS alert record
		return ""
	case strings.HasPrefix(s, "HTTP/1.0 400") && strings.Contains(s, "HTTPS server"):
		return ""
	}
	return s
}

// fetchedCount fetches keys and returns how many came back.
func fetchedCount(t *testing.T, c *client.Client, keys []index.Key) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	blocks, err := c.Get(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range blocks {
		if b.Found {
			n++
		}
	}
	return n
}

// New certificate files and a SIGHUP: new connections on every port get
// the new certificate, while a load over connections old and new runs
// across the reload without a single failed request. A reload of a broken
// file keeps the certificate in use.
func TestCertificateRotationUnderLoadOnSIGHUP(t *testing.T) {
	t.Parallel()
	n := startTLSNode(t, "optional")
	c := n.api()
	var ops, failed atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		failed.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 { // blocks through gRPC and the data plane's pooled connections
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				k := index.Key{NS: index.NamespaceID(100 + w), Hash: index.Hash(i%64 + 1)}
				err := c.Put(ctx, []client.Block{{Key: k, Data: blockData(i, 16<<10)}})
				if err == nil {
					var got []client.Result
					if got, err = c.Get(ctx, []index.Key{k}); err == nil && got[0].Err != nil {
						err = got[0].Err
					}
				}
				cancel()
				if err != nil {
					fail(err)
				}
				ops.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() { // a new RESP connection for every command
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := pingTLS(n.respTLS, n.tls); err != nil {
				fail(err)
			}
			ops.Add(1)
		}
	}()

	time.Sleep(300 * time.Millisecond)
	old := n.cert.Cert.SerialNumber.String()
	rotated := n.ca.Issue(t, n.dir, "node") // the same files, rewritten
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	want := rotated.Cert.SerialNumber.String()
	for _, addr := range []string{n.grpc, n.data, n.respTLS, n.http} {
		eventually(t, 10*time.Second, "a new connection to "+addr+" gets the new certificate", func() bool {
			got, err := servedSerial(addr, n.tls)
			return err == nil && got == want
		})
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d requests failed across the reload; first: %v", f, ops.Load(), firstErr.Load())
	}
	if got, err := servedSerial(n.grpc, n.tls); err != nil || got == old {
		t.Fatalf("after the reload: %v, serial %s", err, got)
	}
	if !strings.Contains(n.log.String(), "reloaded") {
		t.Errorf("the node did not log its reload:\n%s", n.log)
	}

	// A broken certificate file: the reload fails, says so, and the node
	// keeps serving the certificate it had.
	if err := os.WriteFile(n.cert.CertFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	n.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, "the node logs the failed reload", func() bool {
		return strings.Contains(n.log.String(), "reload failed")
	})
	if got, err := servedSerial(n.respTLS, n.tls); err != nil || got != want {
		t.Fatalf("after a failed reload: %v, serial %s, want the one in use, %s", err, got, want)
	}
	if err := pingTLS(n.respTLS, n.tls); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests across the reload", ops.Load())
}

// pingTLS opens a TLS connection to a RESP server and sends it a PING.
func pingTLS(addr string, conf *tls.Config) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, conf)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Three nodes with certificates of one CA, mutual TLS between them and a
// cluster token: raft and gRPC over TLS, the cluster forms and replicates
// the directory; the raft port lets in neither plaintext nor a
// certificate of another CA.
func TestClusterFormsAndReplicatesOverTLSWithAClusterToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	token := filepath.Join(dir, "cluster-token")
	if err := os.WriteFile(token, []byte("a cluster secret the members share\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	clientConf := &tls.Config{RootCAs: pool}
	nodes := startClusterWith(t, loopback(3), func(i int, p *proc) {
		cert := ca.Issue(t, dir, fmt.Sprintf("node%d", i+1))
		p.args = append(p.args, "--tls-cert-file", cert.CertFile, "--tls-key-file", cert.KeyFile)
		p.tls = clientConf
	}, "--tls-ca-file", ca.CAFile, "--auth-cluster-token-file", token)

	keys := putBlocks(t, nodes[0].api(), 9, 0, 8, 4<<10)
	if err := syncNode(nodes[0].api(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, p := range nodes[1:] {
		eventually(t, 10*time.Second, "the other nodes' directories list node 1's blocks", func() bool {
			return allLocatedAt(t, p.api(), keys, 1)
		})
	}
	waitDigestsEqual(t, nodes...)

	raft := nodes[0].args[slices.Index(nodes[0].args, "--cluster-raft-addr")+1]
	if reply := plaintextReply(t, raft); reply != "" {
		t.Errorf("the raft port answered a plaintext client: %q", reply)
	}
	intruder := tlstest.NewCA(t, dir, "stranger").Issue(t, dir, "intruder")
	cert, _ := tls.LoadX509KeyPair(intruder.CertFile, intruder.KeyFile)
	if err := talkTLS(raft, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}); err == nil {
		t.Error("the raft port let in a certificate of another CA")
	}
	if err := talkTLS(raft, clientConf); err == nil {
		t.Error("the raft port let in a client without a certificate")
	}
}

// A node told to listen where others can reach it, without TLS and
// authentication, refuses to start, says why and names the setting that
// would let it.
func TestRemoteListenerWithoutTLSAndAuthRefusesToStart(t *testing.T) {
	t.Parallel()
	usageErrorSays(t, []string{"serve", "--data-dir", t.TempDir(), "--listen-grpc", "0.0.0.0:0", "--advertise-host", "127.0.0.1",
		"--listen-data", "", "--listen-resp", "", "--listen-http", "", "--cluster-raft-addr", freeport.Addr(t)},
		"refusing to listen on listen.grpc 0.0.0.0:0 without TLS (tls.cert-file) and authentication (auth.users-file)",
		"insecure.allow-remote")
}
