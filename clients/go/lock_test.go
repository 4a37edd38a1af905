package raftlock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/clientv3"

	"raftlock/lockpb"
)

func session(t *testing.T, client *Client, ttl time.Duration) *Session {
	t.Helper()
	s, err := client.Session(bg, ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(bg) })
	return s
}

func lock(t *testing.T, s *Session, name string, opts ...LockOption) *Lock {
	t.Helper()
	l, err := s.Lock(bg, name, opts...)
	if err != nil {
		t.Fatalf("lock %s: %v", name, err)
	}
	return l
}

func release(t *testing.T, l interface {
	Release(context.Context) (bool, error)
}) bool {
	t.Helper()
	released, err := l.Release(bg)
	if err != nil {
		t.Fatal(err)
	}
	return released
}

func holderTokens(t *testing.T, client *Client, name string, permits uint32) []int64 {
	t.Helper()
	d, err := client.Describe(bg, name, permits)
	if err != nil {
		t.Fatal(err)
	}
	var tokens []int64
	for _, h := range d.Holders {
		tokens = append(tokens, h.Token)
	}
	return tokens
}

// etcd is Debian's clientv3 (etcd 3.4) linked into the same test binary:
// the Go client lives beside it, and it plays the other programs.
func etcd(t *testing.T, c *cluster) *clientv3.Client {
	client, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func TestTryLockWaitAndFencedRelease(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	a, b := session(t, client, 10*time.Second), session(t, client, 10*time.Second)
	first := lock(t, a, "mutex", Try())
	if first.Holds() != 1 || !strings.HasPrefix(first.Key(), "mutex/") {
		t.Fatalf("grant %q holds %d", first.Key(), first.Holds())
	}
	_, err := b.Lock(bg, "mutex", Try())
	var busy *BusyError
	if !errors.As(err, &busy) || !errors.Is(err, ErrBusy) || len(busy.Holders) != 1 || busy.Holders[0].Token != first.Token() {
		t.Fatalf("try-lock of a held lock: %v", err)
	}
	began := time.Now()
	if _, err := b.Lock(bg, "mutex", Wait(300*time.Millisecond)); !errors.Is(err, ErrBusy) {
		t.Fatalf("a timed wait: %v", err)
	}
	if waited := time.Since(began); waited < 300*time.Millisecond {
		t.Fatalf("the wait ended after %s", waited)
	}
	if !release(t, first) || first.Holds() != 0 {
		t.Fatal("the holder's release was refused")
	}
	if release(t, first) {
		t.Fatal("a second release of the same grant was accepted")
	}
	second := lock(t, b, "mutex", Try())
	if second.Token() <= first.Token() {
		t.Fatalf("token %d after %d", second.Token(), first.Token())
	}
	if release(t, first) {
		t.Fatal("a stale token released a later grant")
	}
	if ok, err := first.Validate(bg); ok || err != nil {
		t.Fatalf("a released grant validated: %v %v", ok, err)
	}
	if ok, err := second.Validate(bg); !ok || err != nil {
		t.Fatalf("the holder did not validate: %v %v", ok, err)
	}
	// A waiter that waits until granted gets the lock when it is released.
	granted := make(chan *Lock, 1)
	go func() {
		l, err := a.Lock(bg, "mutex")
		if err != nil {
			t.Error(err)
		}
		granted <- l
	}()
	eventually(t, "the waiter queued", func() bool {
		d, _ := client.Describe(bg, "mutex", 0)
		return d != nil && len(d.Waiters) == 1
	})
	release(t, second)
	select {
	case l := <-granted:
		if l.Token() <= second.Token() {
			t.Fatalf("the waiter's token %d", l.Token())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was never granted")
	}
	select {
	case <-first.Lost():
		t.Fatalf("a released grant was told lost: %v", first.Err())
	default:
	}
}

func TestSemaphoresReadLocksAndReentrantHolds(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	s1, s2, s3 := session(t, client, 10*time.Second), session(t, client, 10*time.Second), session(t, client, 10*time.Second)
	p1 := lock(t, s1, "pool", Permits(2), Try())
	p2 := lock(t, s2, "pool", Permits(2), Try())
	if _, err := s3.Lock(bg, "pool", Permits(2), Try()); !errors.Is(err, ErrBusy) {
		t.Fatalf("a third permit of two: %v", err)
	}
	if got := holderTokens(t, client, "pool", 2); len(got) != 2 || got[0] != p1.Token() || got[1] != p2.Token() {
		t.Fatalf("holders %v", got)
	}
	release(t, p1)
	lock(t, s3, "pool", Permits(2), Try())

	r1 := lock(t, s1, "rw", WithMode(Read), Try())
	r2 := lock(t, s2, "rw", WithMode(Read), Try())
	if _, err := s3.Lock(bg, "rw", Try()); !errors.Is(err, ErrBusy) {
		t.Fatalf("a writer beside readers: %v", err)
	}
	release(t, r1)
	release(t, r2)
	w := lock(t, s3, "rw", Try())
	if _, err := s1.Lock(bg, "rw", WithMode(Read), Try()); !errors.Is(err, ErrBusy) {
		t.Fatalf("a reader beside a writer: %v", err)
	}

	again := lock(t, s3, "rw", Reentrant())
	if again.Token() != w.Token() || again.Holds() != 2 {
		t.Fatalf("reentrant acquire: token %d holds %d", again.Token(), again.Holds())
	}
	if !release(t, again) || again.Holds() != 1 {
		t.Fatalf("first of two holds: holds %d", again.Holds())
	}
	if got := holderTokens(t, client, "rw", 0); len(got) != 1 {
		t.Fatal("one hold left should still hold the lock")
	}
	if !release(t, w) || w.Holds() != 0 {
		t.Fatal("the last hold")
	}
	if got := holderTokens(t, client, "rw", 0); len(got) != 0 {
		t.Fatalf("holders after the last hold: %v", got)
	}
}

func TestARevokedLeaseClosesLostAndTheOldTokenGuardsNothing(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	kv := etcd(t, c)
	s := session(t, client, 10*time.Second)
	l := lock(t, s, "guarded", Try())
	if err := client.RevokeLease(bg, s.Lease()); err != nil {
		t.Fatal(err)
	}
	within(t, l.Lost(), 5*time.Second, "a revoked lease's grant told lost")
	// (Revoked before the grant's events were followed, the end is replayed
	// from history, which keeps no cause: the client asks the lease. The
	// keepalive may find the lease gone first: "session lost: its lease
	// ended".)
	if why := l.Err(); !errors.Is(why, ErrLockLost) || !strings.Contains(why.Error(), "its lease ended") {
		t.Fatalf("lost: %v", why)
	}
	within(t, s.Lost(), 10*time.Second, "the session of a revoked lease told lost")
	if !errors.Is(s.Err(), ErrSessionLost) {
		t.Fatalf("session: %v", s.Err())
	}
	if _, err := s.Lock(bg, "guarded", Try()); !errors.Is(err, ErrSessionLost) {
		t.Fatalf("a lost session's acquire: %v", err)
	}
	if release(t, l) {
		t.Fatal("a lost grant's release was accepted")
	}
	// A resource that writes only while the token is the key's create
	// revision refuses the old holder.
	other := session(t, client, 10*time.Second)
	later := lock(t, other, "guarded", Try())
	for _, holder := range []*Lock{l, later} {
		resp, err := kv.Txn(bg).
			If(clientv3.Compare(clientv3.CreateRevision(holder.Key()), "=", holder.Token())).
			Then(clientv3.OpPut("resource", strconv.FormatInt(holder.Token(), 10))).
			Commit()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Succeeded != (holder == later) {
			t.Fatalf("guarded write by token %d succeeded: %v", holder.Token(), resp.Succeeded)
		}
	}
}

func TestAKeyDeletedBySomeoneElseClosesLost(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	s := session(t, client, 10*time.Second)
	l := lock(t, s, "deleted", Try())
	if _, err := etcd(t, c).Delete(bg, l.Key()); err != nil {
		t.Fatal(err)
	}
	within(t, l.Lost(), 5*time.Second, "a deleted key's grant told lost")
	if !strings.Contains(l.Err().Error(), "deleted by another client") {
		t.Fatalf("lost: %v", l.Err())
	}
	select {
	case <-s.Lost():
		t.Fatal("the session was told lost with its lease alive")
	default:
	}
}

func TestHandlesOnOneGrantShareItsHoldsAndItsEnd(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	s := session(t, client, 10*time.Second)
	first := lock(t, s, "shared", Try())
	again := lock(t, s, "shared", Reentrant(), Try())
	if again.Token() != first.Token() || again.Holds() != 2 || again.Lost() != first.Lost() {
		t.Fatalf("a reentrant acquire: token %d holds %d", again.Token(), again.Holds())
	}
	if !release(t, again) || !release(t, first) || first.Holds() != 0 {
		t.Fatal("the two holds were not given back")
	}
	select {
	case <-first.Lost():
		t.Fatalf("the grant released through two handles was told lost: %v", first.Err())
	case <-time.After(300 * time.Millisecond):
	}
	// A plain acquire again is a handle on the same grant too.
	l := lock(t, s, "shared", Try())
	other := lock(t, s, "shared", Try())
	if other.Holds() != 1 || other.Token() != l.Token() {
		t.Fatalf("a plain acquire again: holds %d", other.Holds())
	}
	release(t, other)
	if release(t, l) {
		t.Fatal("the one hold was given back twice")
	}
	select {
	case <-l.Lost():
		t.Fatalf("told lost: %v", l.Err())
	case <-time.After(300 * time.Millisecond):
	}
}

func TestASessionSurvivesAMemberThatHangs(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	s := session(t, client, 3*time.Second)
	l := lock(t, s, "hung", Try())
	c.members[0].Process.Signal(syscall.SIGSTOP) // the member the client talks to
	defer c.members[0].Process.Signal(syscall.SIGCONT)
	began := time.Now()
	if got := holderTokens(t, client, "hung", 0); len(got) != 1 || got[0] != l.Token() {
		t.Fatalf("holders %v", got)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("a read took %s to leave a member that hangs", took)
	}
	outlivesTwoTTLs(t, s, l)
	// Its events are followed elsewhere too: an end is told.
	if err := client.RevokeLease(bg, s.Lease()); err != nil { // client has moved to a live member
		t.Fatal(err)
	}
	within(t, l.Lost(), 25*time.Second, "a grant followed on a member that hangs told lost")
}

// outlivesTwoTTLs waits more than two of the session's TTLs (3 s) and fails
// if the session or the grant was lost: the lease lives only if renewed.
func outlivesTwoTTLs(t *testing.T, s *Session, l *Lock) {
	t.Helper()
	time.Sleep(8 * time.Second)
	select {
	case <-s.Lost():
		t.Fatalf("session lost: %v", s.Err())
	case <-l.Lost():
		t.Fatalf("grant lost: %v", l.Err())
	default:
	}
}

func TestASessionSurvivesTheDeathOfItsMember(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	s := session(t, client, 3*time.Second)
	l := lock(t, s, "survivor", Try())
	c.kill(0) // the member the client talked to
	outlivesTwoTTLs(t, s, l)
	if got := holderTokens(t, client, "survivor", 0); len(got) != 1 || got[0] != l.Token() {
		t.Fatalf("holders %v", got)
	}
	if !release(t, l) {
		t.Fatal("release after the failover")
	}
}

// TestPausedHolder is the holder process of
// TestAHolderPausedPastItsTTLIsToldAndRefused (the test binary run again).
func TestPausedHolder(t *testing.T) {
	endpoints := os.Getenv("RAFTLOCK_GO_PAUSED_HOLDER")
	if endpoints == "" {
		t.Skip("run by TestAHolderPausedPastItsTTLIsToldAndRefused")
	}
	client, err := Connect(bg, strings.Split(endpoints, ","))
	if err != nil {
		t.Fatal(err)
	}
	s, err := client.Session(bg, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(bg, "paused", Try())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("token", l.Token())
	bufio.NewReader(os.Stdin).ReadString('\n') // paused and resumed meanwhile
	select {
	case <-l.Lost():
		fmt.Println("lost true", l.Err())
	case <-time.After(10 * time.Second):
		fmt.Println("lost false")
	}
	released, err := l.Release(bg)
	fmt.Println("released", released, err)
}

func TestAHolderPausedPastItsTTLIsToldAndRefused(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	holder := exec.Command(os.Args[0], "-test.run", "^TestPausedHolder$", "-test.v")
	holder.Env = append(os.Environ(), "RAFTLOCK_GO_PAUSED_HOLDER="+strings.Join(c.endpoints, ","))
	stdin, _ := holder.StdinPipe()
	stdout, _ := holder.StdoutPipe()
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		holder.Process.Signal(syscall.SIGCONT)
		holder.Process.Kill()
		holder.Wait()
	}()
	lines := bufio.NewScanner(stdout)
	line := func(prefix string) []string {
		for lines.Scan() {
			if fields := strings.Fields(lines.Text()); len(fields) > 0 && fields[0] == prefix {
				return fields
			}
		}
		t.Fatalf("the holder never said %q", prefix)
		return nil
	}
	token, _ := strconv.ParseInt(line("token")[1], 10, 64)
	holder.Process.Signal(syscall.SIGSTOP)
	other := session(t, client, 10*time.Second)
	later := lock(t, other, "paused", Wait(15*time.Second)) // granted once the paused lease expired
	if later.Token() <= token {
		t.Fatalf("token %d after the paused holder's %d", later.Token(), token)
	}
	holder.Process.Signal(syscall.SIGCONT)
	fmt.Fprintln(stdin)
	if lost := line("lost"); lost[1] != "true" {
		t.Fatalf("the paused holder was not told: %v", lost)
	}
	if released := line("released"); released[1] != "false" {
		t.Fatalf("the paused holder's release: %v", released)
	}
	if ok, err := later.Validate(bg); !ok || err != nil {
		t.Fatalf("the later holder no longer validates: %v %v", ok, err)
	}
}

func TestGoRaftlockctlAndEtcdctlHoldersExcludeEachOther(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	etcdctl, err := exec.LookPath("etcdctl")
	if err != nil {
		t.Fatal("etcdctl is missing: scripts/test.sh installs it (Debian's etcd-client)")
	}
	endpoints := strings.Join(c.endpoints, ",")
	s := session(t, client, 10*time.Second)
	l := lock(t, s, "shared-name", Try())
	if out, err := exec.Command(c.ctl(), "--endpoints", endpoints, "lock", "shared-name", "--try", "--", "true").CombinedOutput(); err == nil {
		t.Fatalf("raftlockctl took a held lock: %s", out)
	}
	waiter := exec.Command(etcdctl, "--endpoints="+endpoints, "lock", "shared-name", "echo", "etcdctl-held")
	waiter.Env = append(os.Environ(), "ETCDCTL_API=3")
	var out strings.Builder
	waiter.Stdout = &out
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "etcdctl queued", func() bool {
		d, _ := client.Describe(bg, "shared-name", 0)
		return d != nil && len(d.Waiters) == 1
	})
	if strings.Contains(out.String(), "etcdctl-held") {
		t.Fatal("etcdctl ran its command while Go held the lock")
	}
	release(t, l)
	if err := waiter.Wait(); err != nil || !strings.Contains(out.String(), "etcdctl-held") {
		t.Fatalf("etcdctl: %v %q", err, out.String())
	}
	ctl := exec.Command(c.ctl(), "--endpoints", endpoints, "lock", "shared-name", "--", "sleep", "2")
	if err := ctl.Start(); err != nil {
		t.Fatal(err)
	}
	defer ctl.Process.Kill()
	var heldByCtl []int64
	eventually(t, "raftlockctl took the lock", func() bool {
		heldByCtl = holderTokens(t, client, "shared-name", 0)
		return len(heldByCtl) == 1
	})
	if _, err := s.Lock(bg, "shared-name", Try()); !errors.Is(err, ErrBusy) {
		t.Fatalf("Go took the lock raftlockctl holds: %v", err)
	}
	after := lock(t, s, "shared-name", Wait(15*time.Second))
	if after.Token() <= heldByCtl[0] {
		t.Fatalf("token %d after raftlockctl's %d", after.Token(), heldByCtl[0])
	}
	if err := ctl.Wait(); err != nil {
		t.Fatalf("raftlockctl: %v", err)
	}
}

func TestALockReleasedByItsHolderIsNeverToldLost(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	s := session(t, client, 10*time.Second)
	var grants []*Lock
	for i := 0; i < 100; i++ {
		l := lock(t, s, "own-release", Try())
		release(t, l)
		grants = append(grants, l)
	}
	for _, l := range grants {
		select {
		case <-l.Lost():
			t.Fatalf("token %d was told lost after its own release: %v", l.Token(), l.Err())
		default:
		}
	}
}

func TestMultiLocksAreAllOrNoneAndDeadlockFree(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	a, b := session(t, client, 10*time.Second), session(t, client, 10*time.Second)
	set := []LockSpec{{Name: "m/a"}, {Name: "m/b"}, {Name: "m/c", Mode: Read}}
	held, err := a.LockAll(bg, set, Try())
	if err != nil {
		t.Fatal(err)
	}
	grants := held.Grants()
	if len(grants) != 3 || grants[0].Name != "m/a" || grants[2].Name != "m/c" || grants[0].Token != grants[1].Token {
		t.Fatalf("grants %+v", grants)
	}
	// An overlapping set in another order is refused whole.
	_, err = b.LockAll(bg, []LockSpec{{Name: "m/d"}, {Name: "m/b"}}, Try())
	var busy *BusyError
	if !errors.As(err, &busy) || busy.Name != "m/b" {
		t.Fatalf("overlapping set: %v", err)
	}
	if got := holderTokens(t, client, "m/d", 0); len(got) != 0 {
		t.Fatal("a refused multi-lock left a place behind")
	}
	// Many clients asking for overlapping sets in different orders all
	// get them, one after another.
	orders := [][]string{{"x/1", "x/2", "x/3"}, {"x/3", "x/1"}, {"x/2", "x/3"}, {"x/3", "x/2", "x/1"}}
	done := make(chan error, 4*len(orders))
	for round := 0; round < 4; round++ {
		for _, order := range orders {
			go func(order []string) {
				s, err := client.Session(bg, 10*time.Second)
				if err != nil {
					done <- err
					return
				}
				defer s.Close(bg)
				var specs []LockSpec
				for _, n := range order {
					specs = append(specs, LockSpec{Name: n})
				}
				m, err := s.LockAll(bg, specs, Wait(20*time.Second))
				if err != nil {
					done <- err
					return
				}
				time.Sleep(10 * time.Millisecond)
				released, err := m.Release(bg)
				if err == nil && !released {
					err = fmt.Errorf("set %v not released", order)
				}
				done <- err
			}(order)
		}
	}
	for i := 0; i < 4*len(orders); i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// The set is lost as one when one grant's lease ends.
	if err := client.RevokeLease(bg, a.Lease()); err != nil {
		t.Fatal(err)
	}
	within(t, held.Lost(), 5*time.Second, "a multi-lock of a revoked lease told lost")
	if released, _ := held.Release(bg); released {
		t.Fatal("a lost set was released")
	}
}

func TestLockDelayHoldsTheLockAfterAnInvoluntaryEnd(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	a, b := session(t, client, 10*time.Second), session(t, client, 10*time.Second)
	l := lock(t, a, "delayed", Try(), LockDelay(3*time.Second))
	d, err := client.Describe(bg, "delayed", 0)
	if err != nil || len(d.Holders) != 1 || d.Holders[0].LockDelayMs != 3000 {
		t.Fatalf("describe: %v %v", d, err)
	}
	if err := client.RevokeLease(bg, a.Lease()); err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	within(t, l.Lost(), 5*time.Second, "the grant told lost")
	if _, err := b.Lock(bg, "delayed", Try()); !errors.Is(err, ErrBusy) {
		t.Fatalf("a try during the lock-delay: %v", err)
	}
	d, err = client.Describe(bg, "delayed", 0)
	if err != nil || d.LockDelay.GetDelayMs() != 3000 {
		t.Fatalf("describe during the delay: %v %v", d, err)
	}
	after := lock(t, b, "delayed", Wait(15*time.Second))
	if waited := time.Since(ended); waited < 2*time.Second {
		t.Fatalf("granted %s after the involuntary end, within a 3 s lock-delay", waited)
	}
	// A release by the holder has no delay.
	release(t, after)
	lock(t, session(t, client, 10*time.Second), "delayed", Try())
}

func TestElectionsHandOverInCampaignOrder(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	a, b := session(t, client, 10*time.Second), session(t, client, 10*time.Second)
	first, err := a.Campaign(bg, "leader", "a")
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan *Leadership, 1)
	go func() {
		l, err := b.Campaign(bg, "leader", "b")
		if err != nil {
			t.Error(err)
		}
		second <- l
	}()
	if err := first.Proclaim(bg, "a2"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the proclamation seen", func() bool {
		kv, err := client.Leader(bg, "leader")
		return err == nil && kv != nil && string(kv.Value) == "a2"
	})
	select {
	case <-second:
		t.Fatal("the second candidate led while the first did")
	case <-time.After(300 * time.Millisecond):
	}
	if err := first.Resign(bg); err != nil {
		t.Fatal(err)
	}
	var next *Leadership
	select {
	case next = <-second:
	case <-time.After(10 * time.Second):
		t.Fatal("the second candidate never led")
	}
	if next.Token() <= first.Token() {
		t.Fatalf("leader token %d after %d", next.Token(), first.Token())
	}
	kv, err := client.Leader(bg, "leader")
	if err != nil || kv == nil || string(kv.Value) != "b" {
		t.Fatalf("leader: %v %v", kv, err)
	}
	select {
	case <-first.Lost():
		t.Fatal("a resigned leader was told lost")
	default:
	}
	if err := next.Resign(bg); err != nil {
		t.Fatal(err)
	}
	if kv, err := client.Leader(bg, "leader"); kv != nil || err != nil {
		t.Fatalf("leader after both resigned: %v %v", kv, err)
	}
}

func TestErrorsCarryEtcdsCodesAndMessages(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	err := client.RevokeLease(bg, 0x7fff)
	var e *Error
	if !errors.As(err, &e) || e.Code.String() != "NotFound" || e.Message != "etcdserver: requested lease not found" {
		t.Fatalf("revoking an unknown lease: %v", err)
	}
	dead, err := Connect(bg, []string{"127.0.0.1:1"}, WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	if _, err := dead.Describe(bg, "x", 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no member: %v", err)
	}
}

func TestObserveTellsALocksEvents(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	s := session(t, client, 10*time.Second)
	l := lock(t, s, "watched", Try())
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	stream, err := client.Observe(ctx, &lockpb.ObserveRequest{Name: []byte("watched")})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || len(first.Events) != 1 || first.Events[0].Kind != lockpb.LockEvent_HOLDING || first.Events[0].Owner.Token != l.Token() {
		t.Fatalf("first message: %v %v", first, err)
	}
	release(t, l)
	next, err := stream.Recv()
	if err != nil || len(next.Events) != 1 || next.Events[0].Kind != lockpb.LockEvent_RELEASED || !next.Events[0].WasHolding {
		t.Fatalf("after the release: %v %v", next, err)
	}
}

func TestGeneratedCodeIsCurrent(t *testing.T) {
	out, err := exec.Command("./generate.sh", "--check").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

func TestTheREADMEExampleRuns(t *testing.T) {
	c := startCluster(t)
	out, err := exec.Command("go", "run", "raftlock/example", "-endpoints", strings.Join(c.endpoints, ",")).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "holding jobs/nightly/") || !strings.Contains(string(out), "fencing token") {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := holderTokens(t, c.client(t), "jobs/nightly", 0); len(got) != 0 {
		t.Fatalf("the example left a holder: %v", got)
	}
	// The README shows the program as it is.
	program, _ := os.ReadFile("example/main.go")
	readme, _ := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	body := string(program[strings.Index(string(program), "package main"):])
	if !strings.Contains(string(readme), "```go\n"+body+"```") {
		t.Fatal("README.md's Go example is not clients/go/example/main.go: copy it over")
	}
}

func TestDescribeAsksForEveryPageOfALongQueue(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	kv := etcd(t, c)
	// 1,205 keys under one name (the server answers 1,000 waiters a page):
	// the first holds, the others wait, in the order they were created.
	const keys = 1205
	for start := 0; start < keys; start += 100 {
		var puts []clientv3.Op
		for i := start; i < start+100 && i < keys; i++ {
			puts = append(puts, clientv3.OpPut(fmt.Sprintf("long/%05x", i), "w"))
		}
		if _, err := kv.Txn(bg).Then(puts...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	d, err := client.Describe(bg, "long", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Holders) != 1 || string(d.Holders[0].Key) != "long/00000" || d.More {
		t.Fatalf("holders %v, more %v", d.Holders, d.More)
	}
	if len(d.Waiters) != keys-1 {
		t.Fatalf("%d waiters", len(d.Waiters))
	}
	for i, w := range d.Waiters {
		if want := fmt.Sprintf("long/%05x", i+1); string(w.Key) != want {
			t.Fatalf("waiter %d is %s, not %s", i, w.Key, want)
		}
	}
}

func TestListAsksForEveryPageOfManyLocks(t *testing.T) {
	c := startCluster(t)
	client := c.client(t)
	kv := etcd(t, c)
	// 1,205 locks (the server answers 1,000 a page), one lease owning a key
	// in each.
	const locks = 1205
	lease, err := kv.Grant(bg, 60)
	if err != nil {
		t.Fatal(err)
	}
	for start := 0; start < locks; start += 100 {
		var puts []clientv3.Op
		for i := start; i < start+100 && i < locks; i++ {
			owner := fmt.Sprintf("many/%05d/%x", i, int64(lease.ID))
			puts = append(puts, clientv3.OpPut(owner, "w", clientv3.WithLease(lease.ID)))
		}
		if _, err := kv.Txn(bg).Then(puts...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	list, err := client.List(bg, "many/", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != locks {
		t.Fatalf("%d locks listed", len(list))
	}
	for i, l := range list {
		if want := fmt.Sprintf("many/%05d", i); string(l.Name) != want || len(l.Holders) != 1 {
			t.Fatalf("lock %d is %s with %d holders, not %s", i, l.Name, len(l.Holders), want)
		}
	}
}
