package raftlock

// The Go client's runner of the steps every raftlock client runs
// (clients/conformance/locks.json), each case against a real cluster.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

type conformanceStep struct {
	Op         string   `json:"op"`
	As         string   `json:"as"`
	TTL        int64    `json:"ttl"`
	Session    string   `json:"session"`
	Lock       string   `json:"lock"`
	WaitMs     *int64   `json:"wait_ms"`
	Permits    uint32   `json:"permits"`
	Mode       string   `json:"mode"`
	Reentrant  bool     `json:"reentrant"`
	Background bool     `json:"background"`
	Expect     any      `json:"expect"`
	Holders    []string `json:"holders"`
	Holds      *uint32  `json:"holds"`
	TokenAbove string   `json:"token_above"`
	SameAs     string   `json:"same_as"`
	Grant      string   `json:"grant"`
	Waiters    int      `json:"waiters"`
	WithinMs   int64    `json:"within_ms"`
	Cause      string   `json:"cause"`
	Election   string   `json:"election"`
	Value      string   `json:"value"`
}

type conformanceCase struct {
	Name  string            `json:"name"`
	Steps []conformanceStep `json:"steps"`
}

// A grant of a step: a lock or a leadership, or an acquire or campaign
// still waiting in the background.
type conformanceGrant struct {
	lock       *Lock
	leadership *Leadership
	pending    chan conformanceGrant
	err        error
}

func TestConformance(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "clients", "conformance", "locks.json"))
	if err != nil {
		t.Fatal(err)
	}
	var steps struct {
		Cases []conformanceCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &steps); err != nil {
		t.Fatal(err)
	}
	if len(steps.Cases) == 0 {
		t.Fatal("no cases")
	}
	c := startCluster(t)
	for _, cc := range steps.Cases {
		cc := cc
		t.Run(cc.Name, func(t *testing.T) { runConformanceCase(t, c, cc) })
	}
}

func runConformanceCase(t *testing.T, c *cluster, cc conformanceCase) {
	client := c.client(t)
	prefix := fmt.Sprintf("conformance-%08x/", rand.Uint32())
	sessions := map[string]*Session{}
	grants := map[string]conformanceGrant{}
	for i, step := range cc.Steps {
		step := step // a background step's work reads it later
		where := fmt.Sprintf("step %d %+v", i, step)
		switch step.Op {
		case "session":
			sessions[step.As] = session(t, client, time.Duration(step.TTL)*time.Second)
		case "acquire", "campaign":
			s := sessions[step.Session]
			work := func() conformanceGrant {
				if step.Op == "campaign" {
					l, err := s.Campaign(bg, prefix+step.Election, step.Value)
					return conformanceGrant{leadership: l, err: err}
				}
				opts := []LockOption{Permits(step.Permits)}
				if step.WaitMs != nil && *step.WaitMs >= 0 {
					opts = append(opts, Wait(time.Duration(*step.WaitMs)*time.Millisecond))
				}
				if step.Mode == "read" {
					opts = append(opts, WithMode(Read))
				}
				if step.Reentrant {
					opts = append(opts, Reentrant())
				}
				l, err := s.Lock(bg, prefix+step.Lock, opts...)
				return conformanceGrant{lock: l, err: err}
			}
			if step.Background {
				pending := make(chan conformanceGrant, 1)
				go func() { pending <- work() }()
				grants[step.As] = conformanceGrant{pending: pending}
				continue
			}
			g := work()
			if step.Expect == "busy" {
				var busy *BusyError
				if !errors.As(g.err, &busy) {
					t.Fatalf("%s: %v", where, g.err)
				}
				var holders, want []int64
				for _, h := range busy.Holders {
					holders = append(holders, h.Token)
				}
				for _, name := range step.Holders {
					want = append(want, grants[name].held().Token())
				}
				if !reflect.DeepEqual(holders, want) {
					t.Fatalf("%s: holders %v", where, holders)
				}
				continue
			}
			if g.err != nil {
				t.Fatalf("%s: %v", where, g.err)
			}
			grants[step.As] = g
			checkConformanceGrant(t, grants, step.As, step, where)
		case "await":
			var g conformanceGrant
			select {
			case g = <-grants[step.Grant].pending:
			case <-time.After(15 * time.Second):
				t.Fatalf("%s: it never answered", where)
			}
			if g.err != nil {
				t.Fatalf("%s: %v", where, g.err)
			}
			grants[step.Grant] = g
			checkConformanceGrant(t, grants, step.Grant, step, where)
		case "release":
			l := grants[step.Grant].held()
			resp, err := client.Release(bg, l.Key(), l.Token())
			if err != nil || resp.Released != step.Expect.(bool) || (step.Holds != nil && resp.Holds != *step.Holds) {
				t.Fatalf("%s: %v %v", where, resp, err)
			}
		case "validate":
			l := grants[step.Grant].held()
			resp, err := client.Validate(bg, l.Key(), l.Token(), grants[step.Grant].permits())
			if err != nil || resp.Current != step.Expect.(bool) {
				t.Fatalf("%s: %v %v", where, resp, err)
			}
		case "describe":
			// Background steps queue in their own time: look until it
			// matches, 5 s at most.
			want := []int64{}
			for _, name := range step.Holders {
				want = append(want, grants[name].held().Token())
			}
			var holders []int64
			var waiters int
			deadline := time.Now().Add(5 * time.Second)
			for {
				d, err := client.Describe(bg, prefix+step.Lock, step.Permits)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				holders, waiters = []int64{}, len(d.Waiters)
				for _, h := range d.Holders {
					holders = append(holders, h.Token)
				}
				if (reflect.DeepEqual(holders, want) && waiters == step.Waiters) || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !reflect.DeepEqual(holders, want) || waiters != step.Waiters {
				t.Fatalf("%s: holders %v, %d waiters", where, holders, waiters)
			}
		case "revoke":
			if err := client.RevokeLease(bg, sessions[step.Session].Lease()); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
		case "lost":
			l := grants[step.Grant].held()
			within(t, l.Lost(), time.Duration(step.WithinMs)*time.Millisecond, where)
			cause := map[string]string{"lease_ended": "its lease ended", "released": "its key was deleted"}[step.Cause]
			if cause == "" || !strings.Contains(l.Err().Error(), cause) {
				t.Fatalf("%s: %v", where, l.Err())
			}
		case "leader":
			kv, err := client.Leader(bg, prefix+step.Election)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			var value any
			if kv != nil {
				value = string(kv.Value)
			}
			if value != step.Expect {
				t.Fatalf("%s: leader %v", where, value)
			}
		case "resign":
			if err := grants[step.Grant].leadership.Resign(bg); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
		default:
			t.Fatalf("unknown op %q", step.Op)
		}
	}
}

// held is what a lock and a leadership have alike.
type held interface {
	Key() string
	Token() int64
	Lost() <-chan struct{}
	Err() error
}

func (g conformanceGrant) held() held {
	if g.leadership != nil {
		return g.leadership
	}
	return g.lock
}

func (g conformanceGrant) permits() uint32 {
	if g.lock != nil {
		return g.lock.permits
	}
	return 1
}

func checkConformanceGrant(t *testing.T, grants map[string]conformanceGrant, name string, step conformanceStep, where string) {
	t.Helper()
	l := grants[name].held()
	if step.TokenAbove != "" && l.Token() <= grants[step.TokenAbove].held().Token() {
		t.Fatalf("%s: token %d", where, l.Token())
	}
	if step.SameAs != "" {
		other := grants[step.SameAs].held()
		if l.Key() != other.Key() || l.Token() != other.Token() {
			t.Fatalf("%s: grant %s/%d", where, l.Key(), l.Token())
		}
	}
	if step.Holds != nil && grants[name].lock.Holds() != *step.Holds {
		t.Fatalf("%s: holds %d", where, grants[name].lock.Holds())
	}
}
