// Package s3test runs a real S3-compatible server, versitygw with its
// posix backend, for the tests and benchmarks of the s3 tier: no mock
// stands in for the store. Start skips the test when versitygw is not
// installed; install it with
//
//	go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
//
// A Server belongs to one test; its methods must not be called
// concurrently with each other.
package s3test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"go/build"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/tiers/s3"
)

// Region is the region the server reports and Config sets.
const Region = "us-east-1"

// startTimeout bounds how long Start and Restart wait for the server to
// answer.
const startTimeout = 15 * time.Second

// Server is one versitygw process serving a temporary directory.
type Server struct {
	tb             testing.TB
	bin, root, log string
	addr           string
	access, secret string
	cmd            *exec.Cmd
	exited         chan struct{}
}

// Binary returns the path of versitygw, looked for in PATH and then in
// $GOPATH/bin, or "" when neither has it.
func Binary() string {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	gopaths := filepath.SplitList(build.Default.GOPATH)
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		// go env also knows a GOPATH set with go env -w.
		gopaths = append(gopaths, filepath.SplitList(strings.TrimSpace(string(out)))...)
	}
	for _, dir := range gopaths {
		p := filepath.Join(dir, "bin", "versitygw")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// Start starts a server on a free port of 127.0.0.1, with a fresh
// directory and random credentials, waits until it answers, and stops it
// when the test ends. It skips the test when versitygw is not installed.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin := Binary()
	if bin == "" {
		tb.Skip("s3test: versitygw not found in PATH or $GOPATH/bin; install it with " +
			"`go install github.com/versity/versitygw/cmd/versitygw@v1.8.0` to run the S3 tier's tests")
	}
	dir := tb.TempDir()
	s := &Server{
		tb:     tb,
		bin:    bin,
		root:   filepath.Join(dir, "root"),
		log:    filepath.Join(dir, "versitygw.log"),
		access: "AK" + randomHex(9),
		secret: "SK" + randomHex(18),
	}
	if err := os.Mkdir(s.root, 0o755); err != nil {
		tb.Fatal(err)
	}
	var err error
	for range 3 { // a free port may be taken before the server binds it
		if s.addr, err = freeport.Get(); err != nil {
			tb.Fatal(err)
		}
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		tb.Fatalf("s3test: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Endpoint returns the server's host:port.
func (s *Server) Endpoint() string { return s.addr }

// AccessKey and SecretKey are the server's credentials.
func (s *Server) AccessKey() string { return s.access }
func (s *Server) SecretKey() string { return s.secret }

// Config returns a tier configuration for bucket on this server, which
// the tier creates if missing.
func (s *Server) Config(bucket string) s3.Config {
	return s3.Config{
		Endpoint:     s.addr,
		Bucket:       bucket,
		Region:       Region,
		AccessKey:    s.access,
		SecretKey:    s.secret,
		CreateBucket: true,
	}
}

// Client returns a plain minio-go client of the server, for tests that
// look at or tamper with the objects themselves.
func (s *Server) Client() *minio.Client {
	c, err := minio.New(s.addr, &minio.Options{
		Creds:  credentials.NewStaticV4(s.access, s.secret, ""),
		Region: Region,
	})
	if err != nil {
		s.tb.Fatal(err)
	}
	return c
}

// Stop kills the server, as a crash would, and waits for it to exit. The
// data stays for Restart. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Pause freezes the server (SIGSTOP), as a store that hangs would: it
// keeps accepting connections and answers nothing until Resume.
func (s *Server) Pause() {
	s.tb.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.tb.Fatalf("s3test: pause: %v", err)
	}
	s.tb.Cleanup(s.Resume) // a paused process ignores Kill until it runs
	// The signal is sent, not yet taken: a thread already running may still
	// answer a request. Wait until every thread is stopped.
	deadline := time.Now().Add(2 * time.Second)
	for !s.stopped() {
		if time.Now().After(deadline) {
			s.tb.Fatalf("s3test: pause: versitygw (pid %d) did not stop", s.cmd.Process.Pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// stopped reports whether every thread of the server is stopped (state T
// in /proc/PID/task/*/stat).
func (s *Server) stopped() bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", s.cmd.Process.Pid))
	if err != nil {
		return true // no procfs to check: trust the signal
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", s.cmd.Process.Pid, task.Name()))
		if err != nil {
			continue // the thread exited
		}
		// pid (comm) state …: the state follows the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || (stat[i+2] != 'T' && stat[i+2] != 't') {
			return false
		}
	}
	return true
}

// Resume lets a paused server run again.
func (s *Server) Resume() {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Restart starts a stopped server again on the same address and data.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	var err error
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) { // the port may linger a moment
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.tb.Fatalf("s3test: restart: %v", err)
}

// start runs the server and waits until it answers HTTP.
func (s *Server) start() error {
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, "--access", s.access, "--secret", s.secret,
		"--region", Region, "--port", s.addr, "--quiet", "posix", s.root)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(s.log)
			return fmt.Errorf("versitygw on %s exited at start; its log:\n%s", s.addr, tail(log, 2000))
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("versitygw on %s did not answer within %v", s.addr, startTimeout)
		case <-time.After(20 * time.Millisecond):
		}
		resp, err := client.Get("http://" + s.addr + "/")
		if err == nil {
			resp.Body.Close() // any answer, 403 included, means it serves
			s.cmd, s.exited = cmd, exited
			return nil
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
