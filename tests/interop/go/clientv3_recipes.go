// etcd's Go client (clientv3, 3.4 as Debian ships it) and its concurrency
// recipes against a raftlock cluster: the code most etcd lock users run.
// Built offline in GOPATH mode from Debian's golang-etcd-server-dev by
// tests/go_clientv3.rs, which starts the cluster and runs one recipe per
// invocation:
//
//	clientv3_recipes mutex|election|stm|watch ENDPOINTS
//
// ENDPOINTS is comma-separated; the client balances over all of them, as
// applications' clients do. Each recipe checks its own outcome and prints
// "ok" as its last line on success; any failure exits non-zero with the
// reason. The election recipe prints "kill" when it wants a member killed and
// waits for a line on stdin saying it was done.
package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func check(err error, what string) {
	if err != nil {
		fail("%s: %v", what, err)
	}
}

// retried runs op until it succeeds, again while it fails with Unavailable
// (for 20 s at most): just after a member dies, a request the client sends
// over its connection to that member fails so, and clientv3 leaves retrying
// a write to the application. Only for operations that may run twice.
func retried(what string, op func() error) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := op()
		if err == nil {
			return
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			fail("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func connect(endpoints []string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	check(err, "connect")
	return c
}

// timeout is a context that ends after d (its timer is left to run out: the
// program is short-lived).
func timeout(d time.Duration) context.Context {
	ctx, _ := context.WithTimeout(context.Background(), d) //nolint:govet
	return ctx
}

// mutex: eight sessions contend for one concurrency.Mutex, each adding one to
// a counter 25 times by an unguarded read-modify-write; with mutual exclusion
// no increment is lost and no two holders overlap.
func mutex(endpoints []string) {
	const workers, rounds = 8, 25
	var holders int32
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := connect(endpoints)
			defer c.Close()
			s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
			check(err, "session")
			defer s.Close()
			m := concurrency.NewMutex(s, "interop/mutex")
			for i := 0; i < rounds; i++ {
				check(m.Lock(timeout(30*time.Second)), "lock")
				if n := atomic.AddInt32(&holders, 1); n != 1 {
					fail("worker %d holds the mutex with %d others", w, n-1)
				}
				r, err := c.Get(timeout(10*time.Second), "interop/counter")
				check(err, "get counter")
				n := 0
				if len(r.Kvs) == 1 {
					n, err = strconv.Atoi(string(r.Kvs[0].Value))
					check(err, "counter value")
				}
				time.Sleep(time.Duration(rand.Intn(2)) * time.Millisecond)
				// Only the holder writes: the put is guarded by its ownership.
				t, err := c.Txn(timeout(10 * time.Second)).If(m.IsOwner()).
					Then(clientv3.OpPut("interop/counter", strconv.Itoa(n+1))).Commit()
				check(err, "put counter")
				if !t.Succeeded {
					fail("worker %d lost the lock while holding it", w)
				}
				atomic.AddInt32(&holders, -1)
				check(m.Unlock(timeout(10*time.Second)), "unlock")
			}
		}(w)
	}
	wg.Wait()
	c := connect(endpoints)
	defer c.Close()
	r, err := c.Get(timeout(10*time.Second), "interop/counter")
	check(err, "final get")
	if got := string(r.Kvs[0].Value); got != strconv.Itoa(workers*rounds) {
		fail("counter is %s after %d guarded increments", got, workers*rounds)
	}
	left, err := c.Get(timeout(10*time.Second), "interop/mutex", clientv3.WithPrefix())
	check(err, "queue")
	if len(left.Kvs) != 0 {
		fail("%d mutex keys left after every unlock", len(left.Kvs))
	}
	fmt.Println("ok")
}

// election: a campaigns and leads; b campaigns and waits; an observer sees
// every leader value in order. A member is killed (by the test) while b
// waits; a proclaims a new value, resigns, and b leads.
func election(endpoints []string) {
	observerClient := connect(endpoints)
	defer observerClient.Close()
	so, err := concurrency.NewSession(observerClient, concurrency.WithTTL(10))
	check(err, "observer session")
	observed := make(chan string, 16)
	ctx, stopObserving := context.WithCancel(context.Background())
	go func() {
		for r := range concurrency.NewElection(so, "interop/election").Observe(ctx) {
			if len(r.Kvs) > 0 {
				observed <- string(r.Kvs[0].Value)
			}
		}
	}()
	expect := func(want string) {
		select {
		case got := <-observed:
			if got != want {
				fail("observed leader value %q, want %q", got, want)
			}
		case <-time.After(20 * time.Second):
			fail("never observed leader value %q", want)
		}
	}

	ca, cb := connect(endpoints), connect(endpoints)
	defer ca.Close()
	defer cb.Close()
	sa, err := concurrency.NewSession(ca, concurrency.WithTTL(10))
	check(err, "session a")
	sb, err := concurrency.NewSession(cb, concurrency.WithTTL(10))
	check(err, "session b")
	ea, eb := concurrency.NewElection(sa, "interop/election"), concurrency.NewElection(sb, "interop/election")
	check(ea.Campaign(timeout(20*time.Second), "a"), "campaign a")
	expect("a")
	bLeads := make(chan error, 1)
	go func() { bLeads <- eb.Campaign(timeout(60*time.Second), "b") }()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-bLeads:
		fail("b won while a leads (%v)", err)
	default:
	}

	fmt.Println("kill")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fail("waiting for the kill: %v", err)
	}
	// Proclaiming the same value again, and resigning again, change nothing.
	retried("proclaim a2", func() error { return ea.Proclaim(timeout(30*time.Second), "a2") })
	expect("a2")
	var leader *clientv3.GetResponse
	retried("leader", func() (err error) { leader, err = ea.Leader(timeout(30 * time.Second)); return })
	if v := string(leader.Kvs[0].Value); v != "a2" {
		fail("leader value %q, want a2", v)
	}
	retried("resign a", func() error { return ea.Resign(timeout(30 * time.Second)) })
	select {
	case err := <-bLeads:
		check(err, "campaign b")
	case <-time.After(30 * time.Second):
		fail("b never led after a resigned")
	}
	expect("b")
	retried("resign b", func() error { return eb.Resign(timeout(30 * time.Second)) })
	stopObserving()
	fmt.Println("ok")
}

// stm: eight workers move random amounts between five accounts with
// concurrency.NewSTM (serializable); the total is conserved and no account
// goes negative.
func stm(endpoints []string) {
	const accounts, start, workers, transfers = 5, 100, 8, 40
	c := connect(endpoints)
	defer c.Close()
	for i := 0; i < accounts; i++ {
		_, err := c.Put(timeout(10*time.Second), fmt.Sprintf("interop/account/%d", i), strconv.Itoa(start))
		check(err, "open account")
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			wc := connect(endpoints)
			defer wc.Close()
			rnd := rand.New(rand.NewSource(int64(w)))
			for t := 0; t < transfers; t++ {
				from, to := rnd.Intn(accounts), rnd.Intn(accounts)
				if from == to {
					continue
				}
				_, err := concurrency.NewSTM(wc, func(s concurrency.STM) error {
					fk, tk := fmt.Sprintf("interop/account/%d", from), fmt.Sprintf("interop/account/%d", to)
					fv, _ := strconv.Atoi(s.Get(fk))
					tv, _ := strconv.Atoi(s.Get(tk))
					amount := fv / 2
					s.Put(fk, strconv.Itoa(fv-amount))
					s.Put(tk, strconv.Itoa(tv+amount))
					return nil
				})
				check(err, "transfer")
			}
		}(w)
	}
	wg.Wait()
	r, err := c.Get(timeout(10*time.Second), "interop/account/", clientv3.WithPrefix())
	check(err, "read accounts")
	if len(r.Kvs) != accounts {
		fail("%d accounts, want %d", len(r.Kvs), accounts)
	}
	total := 0
	for _, kv := range r.Kvs {
		v, err := strconv.Atoi(string(kv.Value))
		check(err, "account value")
		if v < 0 {
			fail("account %s is negative: %d", kv.Key, v)
		}
		total += v
	}
	if total != accounts*start {
		fail("total %d, want %d", total, accounts*start)
	}
	fmt.Println("ok")
}

// watch: a watch from the next revision sees puts and a delete in order, with
// previous values; a second watch from an earlier revision replays them.
func watch(endpoints []string) {
	c := connect(endpoints)
	defer c.Close()
	first, err := c.Put(timeout(10*time.Second), "interop/w/start", "0")
	check(err, "put")
	from := first.Header.Revision + 1
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	live := c.Watch(ctx, "interop/w/", clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV())
	var want []string
	for i := 0; i < 5; i++ {
		_, err := c.Put(timeout(10*time.Second), "interop/w/k", strconv.Itoa(i))
		check(err, "put")
		want = append(want, "PUT interop/w/k "+strconv.Itoa(i))
	}
	_, err = c.Delete(timeout(10*time.Second), "interop/w/k")
	check(err, "delete")
	want = append(want, "DELETE interop/w/k ")
	read := func(ch clientv3.WatchChan) []string {
		var got []string
		deadline := time.After(20 * time.Second)
		for len(got) < len(want) {
			select {
			case r, open := <-ch:
				if !open {
					fail("watch closed after %v", got)
				}
				check(r.Err(), "watch")
				for _, e := range r.Events {
					got = append(got, fmt.Sprintf("%s %s %s", e.Type, e.Kv.Key, e.Kv.Value))
					if e.Type == clientv3.EventTypeDelete && (e.PrevKv == nil || string(e.PrevKv.Value) != "4") {
						fail("a delete without its previous value: %v", e.PrevKv)
					}
				}
			case <-deadline:
				fail("watch saw %v, want %v", got, want)
			}
		}
		return got
	}
	if got := read(live); strings.Join(got, "|") != strings.Join(want, "|") {
		fail("watch saw %v, want %v", got, want)
	}
	replay := c.Watch(ctx, "interop/w/k", clientv3.WithRev(from), clientv3.WithPrevKV())
	if got := read(replay); strings.Join(got, "|") != strings.Join(want, "|") {
		fail("replay saw %v, want %v", got, want)
	}
	fmt.Println("ok")
}

// lockOnce: one concurrency.Mutex on the name given, taken once: prints
// "queued" once its key is in the queue, "locked" when Lock returns, then
// unlocks. For the lock-delay test, which times the lines.
func lockOnce(endpoints []string, name string) {
	c := connect(endpoints)
	defer c.Close()
	s, err := concurrency.NewSession(c, concurrency.WithTTL(30))
	check(err, "session")
	m := concurrency.NewMutex(s, name)
	done := make(chan error, 1)
	go func() { done <- m.Lock(timeout(60 * time.Second)) }()
	// Lock puts its key first, then waits: say so once the key exists.
	for {
		keys, err := c.Get(timeout(5*time.Second), fmt.Sprintf("%s/%x", name, s.Lease()))
		check(err, "get own key")
		if len(keys.Kvs) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("queued")
	check(<-done, "lock")
	fmt.Println("locked")
	check(m.Unlock(timeout(5*time.Second)), "unlock")
	fmt.Println("ok")
}

func main() {
	if len(os.Args) == 4 && os.Args[1] == "lock-once" {
		lockOnce(strings.Split(os.Args[2], ","), os.Args[3])
		return
	}
	if len(os.Args) != 3 {
		fail("usage: clientv3_recipes mutex|election|stm|watch ENDPOINTS, or lock-once ENDPOINTS NAME")
	}
	endpoints := strings.Split(os.Args[2], ",")
	switch os.Args[1] {
	case "mutex":
		mutex(endpoints)
	case "election":
		election(endpoints)
	case "stm":
		stm(endpoints)
	case "watch":
		watch(endpoints)
	default:
		fail("unknown recipe %q", os.Args[1])
	}
}
