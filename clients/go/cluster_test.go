package raftlock

// A real 3-member raftlock cluster for the client's tests: processes of the
// `raftlock` binary named by $RAFTLOCK_BIN (default: the repository's
// target/debug/raftlock), on free ports of 127.0.0.1, each test its own.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type cluster struct {
	binary    string
	endpoints []string
	members   []*exec.Cmd
	// How the tests' clients connect (TLS, for a cluster under mTLS).
	opts []Option
}

// freePort is a port for a member to listen on, chosen the way the
// repository's Rust harness (testkit::free_port) chooses: not the OS's "any
// free port", which can hand out one port twice before a member binds it and
// lies in the ephemeral range, where an outgoing connection (a member's to
// its peers) can take it meanwhile. Each test process walks its own sequence
// of 20000-31999, below the ephemeral range, skipping ports that are busy,
// and claims each port it hands out machine-wide for its life: an exclusive
// flock on /tmp/raftlock-test-ports/<port>, which the kernel drops when the
// process ends, so test processes running at once never pick one port.
func freePort(t *testing.T) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	const first, span = 20000, 12000
	start := (os.Getpid() * 7919) % span
	for tried := 0; tried < span; tried++ {
		port := first + (start+nextPort)%span
		nextPort++
		if !claimPort(port) {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	t.Fatal("no free port in 20000-31999")
	return 0
}

var (
	portsMu    sync.Mutex
	nextPort   int
	heldClaims []*os.File
)

const portClaims = "/tmp/raftlock-test-ports"

// claimPort takes port's claim for this process (false: another holds it).
func claimPort(port int) bool {
	if err := os.MkdirAll(portClaims, 0o777); err != nil {
		return true // nowhere to claim: the sequence alone
	}
	f, err := os.OpenFile(filepath.Join(portClaims, strconv.Itoa(port)), os.O_CREATE|os.O_WRONLY, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	heldClaims = append(heldClaims, f)
	return true
}

// repoRoot is the repository's root (this package lives in clients/go).
func repoRoot(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// The GOPATH the tests run in links src/raftlock to clients/go.
	if resolved, err := filepath.EvalSymlinks(wd); err == nil {
		wd = resolved
	}
	return filepath.Dir(filepath.Dir(wd))
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	return startClusterWith(t, nil)
}

// startClusterWith starts members under mTLS on both ports when certs is
// set (clients connect with the "alice" certificate).
func startClusterWith(t *testing.T, certs *testCerts) *cluster {
	t.Helper()
	binary := os.Getenv("RAFTLOCK_BIN")
	if binary == "" {
		binary = filepath.Join(repoRoot(t), "target", "debug", "raftlock")
	}
	if _, err := os.Stat(binary); err != nil {
		t.Fatalf("%s is missing: build raftlock first (cargo build), or set RAFTLOCK_BIN", binary)
	}
	dir := t.TempDir()
	c := &cluster{binary: binary}
	scheme, tlsFlags := "http", []string(nil)
	if certs != nil {
		scheme, tlsFlags = "https", certs.memberFlags()
		c.opts = []Option{WithTLS(certs.clientConfig(t, certs.alice))}
	}
	var peers, initial []string
	for i := 0; i < 3; i++ {
		c.endpoints = append(c.endpoints, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		peers = append(peers, fmt.Sprintf("%s://127.0.0.1:%d", scheme, freePort(t)))
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peers[i]))
	}
	for i := 0; i < 3; i++ {
		url := scheme + "://" + c.endpoints[i]
		args := []string{"--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(dir, fmt.Sprintf("m%d", i)),
			"--listen-client-urls", url, "--advertise-client-urls", url,
			"--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new"}
		member := exec.Command(binary, append(args, tlsFlags...)...)
		log, err := os.Create(filepath.Join(dir, fmt.Sprintf("m%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		member.Stdout, member.Stderr = log, log
		if err := member.Start(); err != nil {
			t.Fatal(err)
		}
		c.members = append(c.members, member)
	}
	t.Cleanup(c.stop)
	// Ready when a lease can be granted (a write through the leader).
	client := c.client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := client.Session(ctx, 5*time.Second)
		cancel()
		if err == nil {
			s.Close(context.Background())
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster never served: %v\n%s", err, memberLogs(dir, len(c.members)))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// memberLogs is the end of each member's log, for a cluster that failed.
func memberLogs(dir string, members int) string {
	var out strings.Builder
	for i := 0; i < members; i++ {
		log, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("m%d.log", i)))
		if len(log) > 4000 {
			log = log[len(log)-4000:]
		}
		fmt.Fprintf(&out, "--- m%d's log (end):\n%s\n", i, log)
	}
	return out.String()
}

// client is a new client of every member, closed with the test.
func (c *cluster) client(t *testing.T, opts ...Option) *Client {
	all := append(append([]Option{WithTimeout(2 * time.Second)}, c.opts...), opts...)
	client, err := Connect(context.Background(), c.endpoints, all...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func (c *cluster) kill(i int) {
	c.members[i].Process.Signal(syscall.SIGKILL)
	c.members[i].Wait()
}

func (c *cluster) stop() {
	for _, m := range c.members {
		if m.ProcessState == nil {
			m.Process.Kill()
			m.Wait()
		}
	}
}

// ctl is raftlockctl, next to the raftlock binary.
func (c *cluster) ctl() string {
	return filepath.Join(filepath.Dir(c.binary), "raftlockctl")
}

// eventually retries check every 50 ms until it is true, 10 s at most.
func eventually(t *testing.T, what string, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// within fails unless ch is closed within d.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("not within %s: %s", d, what)
	}
}

var bg = context.Background()
