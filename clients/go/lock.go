package raftlock

// Locks: grants of raftlock's native API, taken through a Session. Each
// grant follows its lock's events (Observe, from the grant's revision) and
// closes its Lost channel when they say the grant ended without its holder
// releasing it — its lease expired or was revoked, or its key was deleted
// by someone else — as soon as the member the client follows applies that
// change; and when its session is lost.
//
// Invariants: Release is fenced by the token, so it never deletes a later
// grant; Lost is closed once, and never for the holder's own last release
// (an end seen in the events while a release of the holder's is in flight
// is held back until the release's answer says whose it was).
//
// Caveat: a holder that is paused (a GC pause, a stopped process) learns
// nothing while paused; what protects the resource then is the fencing
// token (or a lock-delay), which is why Token is there.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"raftlock/lockpb"
)

// Mode is a lock's mode: Write (exclusive, the default) or Read (shared
// with other readers).
type Mode = lockpb.Mode

const (
	Write = lockpb.Mode_WRITE
	Read  = lockpb.Mode_READ
)

// A LockOption shapes an acquire.
type LockOption func(*lockOptions)

type lockOptions struct {
	waitMs    int64
	permits   uint32
	mode      Mode
	reentrant bool
	metadata  []byte
	lockDelay time.Duration
}

// Try asks once: the lock is granted at once or ErrBusy is returned.
func Try() LockOption { return func(o *lockOptions) { o.waitMs = 0 } }

// Wait waits at most d for the lock (ErrBusy after it). Without Try or
// Wait an acquire waits until granted, or until its context ends.
func Wait(d time.Duration) LockOption {
	return func(o *lockOptions) {
		o.waitMs = 0 // a wait of 0 or less asks once
		if d > 0 {
			o.waitMs = int64((d + time.Millisecond - 1) / time.Millisecond)
		}
	}
}

// Permits makes the lock a semaphore of n holders (every user of a name
// must agree on n).
func Permits(n uint32) LockOption { return func(o *lockOptions) { o.permits = n } }

// WithMode takes the lock in mode m (Read: shared with other readers).
func WithMode(m Mode) LockOption { return func(o *lockOptions) { o.mode = m } }

// Reentrant adds a hold when the session holds the lock already (each hold
// is given back by one Release).
func Reentrant() LockOption { return func(o *lockOptions) { o.reentrant = true } }

// Metadata is stored as the owner key's value, shown by Describe.
func Metadata(m []byte) LockOption { return func(o *lockOptions) { o.metadata = m } }

// LockDelay keeps the lock from anyone else for d (at most 60 s) after
// this grant ends involuntarily; a Release has no delay.
func LockDelay(d time.Duration) LockOption {
	return func(o *lockOptions) { o.lockDelay = d }
}

func (s *Session) acquire(ctx context.Context, req *lockpb.AcquireRequest, opts []LockOption) (*lockpb.AcquireResponse, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	o := lockOptions{waitMs: -1}
	for _, opt := range opts {
		opt(&o)
	}
	req.Lease = s.lease
	req.WaitMs = o.waitMs
	req.Metadata = o.metadata
	req.LockDelayMs = uint32(o.lockDelay.Milliseconds())
	if len(req.Locks) == 0 {
		req.Permits, req.Mode, req.Reentrant = o.permits, o.mode, o.reentrant
	} else if o.permits != 0 || o.mode != Write || o.reentrant {
		return nil, &Error{Code: codes.InvalidArgument, Message: "a multi-lock's permits and modes are given per lock (LockSpec); it cannot be reentrant"}
	}
	timeout := time.Duration(0) // waits until granted or ctx ends
	if o.waitMs >= 0 {
		timeout = time.Duration(o.waitMs)*time.Millisecond + s.client.opts.timeout
	}
	resp := &lockpb.AcquireResponse{}
	if err := s.client.invoke(ctx, methodAcquire, req, resp, timeout, retryUnavailable); err != nil {
		return nil, err
	}
	return resp, nil
}

// Lock acquires lock name for the session's lease; by default it waits
// until granted (see Try, Wait, Permits, WithMode, Reentrant, Metadata,
// LockDelay). Not granted in time: a *BusyError (ErrBusy) with the holders.
func (s *Session) Lock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	req := &lockpb.AcquireRequest{Name: []byte(name)}
	resp, err := s.acquire(ctx, req, opts)
	if err != nil {
		return nil, err
	}
	if !resp.Acquired {
		return nil, &BusyError{Name: name, Holders: resp.Holders}
	}
	permits := req.Permits
	if permits == 0 {
		permits = 1
	}
	return newLock(s, name, permits, string(resp.Key), resp.Token, resp.Holds), nil
}

// A Lock is a grant: its owner key, fencing token and holds, and Lost.
type Lock struct {
	session *Session
	name    string
	permits uint32
	key     string
	token   int64
	end     *grantEnd

	mu    sync.Mutex
	holds uint32
}

func newLock(s *Session, name string, permits uint32, key string, token int64, holds uint32) *Lock {
	l := &Lock{session: s, name: name, permits: permits, key: key, token: token, holds: holds}
	l.end = s.end(name, permits, key, token)
	return l
}

// Name is the lock's name.
func (l *Lock) Name() string { return l.name }

// Key is the owner key, "<name>/<lease hex>" (or a reader's).
func (l *Lock) Key() string { return l.key }

// Token is the fencing token: the owner key's create revision, greater for
// every later grant of the lock.
func (l *Lock) Token() int64 { return l.token }

// Holds is how many holds the session has on the grant (reentrant
// acquires), as of the last answer.
func (l *Lock) Holds() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holds
}

// Lost is closed when the grant ended without its holder releasing it.
func (l *Lock) Lost() <-chan struct{} { return l.end.lost }

// Err says why the grant was lost (a *LostError matching ErrLockLost), or nil.
func (l *Lock) Err() error { return l.end.error() }

// Release gives back one hold, fenced by the token: true if it was
// released (Holds is then what is left; 0 released the lock), false if the
// grant had already ended (nothing was changed). Every handle on the
// grant (an acquire of a lock the session holds gives another) shares
// its holds and its end. When the member does not answer, the release is
// not made again (see Client.Release): the error says the answer was lost,
// and a deletion of the key seen meanwhile counts as this release's.
func (l *Lock) Release(ctx context.Context) (bool, error) {
	l.end.releaseStarts()
	resp, err := l.session.client.Release(ctx, l.key, l.token)
	if err != nil {
		l.end.releaseFailed(err)
		return false, err
	}
	if resp.Released {
		l.mu.Lock()
		l.holds = resp.Holds
		l.mu.Unlock()
	}
	l.end.releaseEnded(resp.Released, resp.Holds)
	return resp.Released, nil
}

// Validate tells, read linearizably, whether the grant still holds its lock.
func (l *Lock) Validate(ctx context.Context) (bool, error) {
	resp, err := l.session.client.Validate(ctx, l.key, l.token, l.permits)
	if err != nil {
		return false, err
	}
	return resp.Current, nil
}

// A LockSpec is one lock of a multi-lock.
type LockSpec struct {
	Name    string
	Mode    Mode
	Permits uint32
}

// A Grant is one lock's grant of a multi-lock.
type Grant struct {
	Name  string
	Key   string
	Token int64
}

// A MultiLock holds several locks, taken together.
type MultiLock struct {
	session *Session
	grants  []Grant
	end     *grantEnd
}

// LockAll acquires every lock of specs for the session's lease, all or
// none (at least two, none nested under another). However many clients
// ask for overlapping sets, in whatever order, nobody deadlocks. Try and
// Wait work as for one lock; Permits, WithMode and Reentrant do not apply
// (modes and permits are per LockSpec). Not granted in time: a *BusyError
// naming the first lock that was not held.
func (s *Session) LockAll(ctx context.Context, specs []LockSpec, opts ...LockOption) (*MultiLock, error) {
	req := &lockpb.AcquireRequest{}
	for _, spec := range specs {
		req.Locks = append(req.Locks, &lockpb.LockSpec{Name: []byte(spec.Name), Mode: spec.Mode, Permits: spec.Permits})
	}
	if len(req.Locks) < 2 {
		return nil, &Error{Code: codes.InvalidArgument, Message: "a multi-lock needs at least two locks"}
	}
	resp, err := s.acquire(ctx, req, opts)
	if err != nil {
		return nil, err
	}
	if !resp.Acquired {
		return nil, &BusyError{Name: string(resp.BlockedOn), Holders: resp.Holders}
	}
	if len(resp.Grants) != len(specs) {
		return nil, &Error{Code: codes.Internal, Message: fmt.Sprintf("a multi-lock of %d locks answered with %d grants", len(specs), len(resp.Grants))}
	}
	m := &MultiLock{session: s}
	for _, g := range resp.Grants {
		m.grants = append(m.grants, Grant{Name: string(g.Name), Key: string(g.Key), Token: g.Token})
	}
	m.end = s.multiEnd(specs, m.grants)
	return m, nil
}

// Grants are the set's grants, in the request's order.
func (m *MultiLock) Grants() []Grant { return append([]Grant(nil), m.grants...) }

// Lost is closed when any grant of the set ended without its holder
// releasing it.
func (m *MultiLock) Lost() <-chan struct{} { return m.end.lost }

// Err says why the set was lost, or nil.
func (m *MultiLock) Err() error { return m.end.error() }

// Release gives back every grant of the set in one call, each fenced by
// its token: true if every one was released.
func (m *MultiLock) Release(ctx context.Context) (bool, error) {
	req := &lockpb.ReleaseRequest{}
	for _, g := range m.grants {
		req.Grants = append(req.Grants, &lockpb.Grant{Key: []byte(g.Key), Token: g.Token})
	}
	m.end.releaseStarts()
	resp := &lockpb.ReleaseResponse{}
	if err := m.session.client.invoke(ctx, methodRelease, req, resp, m.session.client.opts.timeout, retryNever); err != nil {
		m.end.releaseFailed(err)
		return false, err
	}
	m.end.releaseEnded(resp.Released, 0)
	return resp.Released, nil
}

// grantEnd is how a grant (or a multi-lock's set) learns that it ended,
// shared by every handle on it.
type grantEnd struct {
	session *Session
	key     string
	token   int64
	ids     []grantID // under which the session tracks it
	lost    chan struct{}
	ctx     context.Context // ends the followers
	stop    context.CancelFunc

	mu        sync.Mutex
	err       error
	released  bool
	releasing int
	heldBack  *LostError
	// A release whose answer was lost may have been applied: a deletion
	// of the key by a request, seen from then on, is taken for it.
	maybeReleased bool
}

func newGrantEnd(s *Session, key string, token int64) *grantEnd {
	ctx, stop := context.WithCancel(context.Background())
	return &grantEnd{session: s, key: key, token: token, lost: make(chan struct{}), ctx: ctx, stop: stop}
}

func (g *grantEnd) error() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// lost tells the grant (key, token) — one of a multi-lock's, or the grant
// itself — ended without its holder releasing it.
func (g *grantEnd) lose(why *LostError, fromEvents bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.released || g.err != nil {
		return
	}
	if fromEvents && g.releasing > 0 {
		g.heldBack = why
		return
	}
	if fromEvents && g.maybeReleased && why.byRequest {
		g.released = true // the release whose answer was lost
		g.stop()
		go g.session.untrack(g)
		return
	}
	g.err = why
	close(g.lost)
	g.stop()
	go g.session.untrack(g)
}

func (g *grantEnd) loseWithSession(reason string) {
	g.lose(&LostError{Lease: g.session.lease, Key: g.key, Token: g.token, Reason: "session lost: " + reason, Session: true}, false)
}

func (g *grantEnd) releaseStarts() {
	g.mu.Lock()
	g.releasing++
	g.mu.Unlock()
}

// releaseEnded: after a release's answer, with the holds left; an end
// held back is told unless this release gave back the last hold.
func (g *grantEnd) releaseEnded(released bool, holdsLeft uint32) {
	g.mu.Lock()
	g.releasing--
	last := released && holdsLeft == 0
	if last {
		g.released = true
	}
	heldBack := g.heldBack
	g.heldBack = nil
	g.mu.Unlock()
	if last {
		g.stopFollowing()
	}
	if heldBack != nil {
		g.lose(heldBack, false)
	}
}

// releaseFailed: a release got no answer. If its member could not be
// reached or did not answer in time, it may have been applied: a deletion
// by a request seen meanwhile or later is taken for it.
func (g *grantEnd) releaseFailed(err error) {
	code := status.Code(err)
	ambiguous := code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled || code == codes.Unknown
	g.mu.Lock()
	g.releasing--
	if ambiguous {
		g.maybeReleased = true
	}
	heldBack := g.heldBack
	g.heldBack = nil
	g.mu.Unlock()
	if heldBack != nil {
		g.lose(heldBack, true)
	}
}

func (g *grantEnd) stopFollowing() {
	g.stop()
	g.session.untrack(g)
}

// Why a lock's events end a grant, by the event that ended it.
var endReasons = map[lockpb.LockEvent_Kind]string{
	lockpb.LockEvent_RELEASED:    "its key was deleted by another client",
	lockpb.LockEvent_LEASE_ENDED: "its lease ended (expired or revoked)",
	lockpb.LockEvent_ENDED:       "it ended",
}

// grantEndIn is how the grant (key, token) ended, if this message of its
// lock's events says it did (nil if not). fromNow: the stream began with
// the lock as it is (the grant's history was compacted), where a grant
// absent from the first message has ended.
func (g *grantEnd) endIn(message *lockpb.ObserveResponse, key string, token int64, fromNow bool) *LostError {
	ours := false
	for _, e := range message.Events {
		if string(e.Owner.GetKey()) != key || e.Owner.GetToken() != token {
			continue
		}
		ours = true
		if why, ended := endReasons[e.Kind]; ended {
			return &LostError{Lease: g.session.lease, Key: key, Token: token, Reason: why, byRequest: e.Kind == lockpb.LockEvent_RELEASED}
		}
	}
	if fromNow && !ours {
		return &LostError{Lease: g.session.lease, Key: key, Token: token, Reason: endReasons[lockpb.LockEvent_ENDED]}
	}
	return nil
}

// causeFromLease tells how a grant whose end its events could not tell
// (replayed from history, which keeps no cause) ended, from its lease now:
// gone means its lease ended, else its key was deleted. Left as it is when
// the lease cannot be asked about.
func (g *grantEnd) causeFromLease(why *LostError) {
	ttl, err := g.session.client.LeaseTTL(g.ctx, g.session.lease)
	switch {
	case err != nil:
	case ttl < 0:
		why.Reason = endReasons[lockpb.LockEvent_LEASE_ENDED]
	default:
		why.Reason, why.byRequest = endReasons[lockpb.LockEvent_RELEASED], true
	}
}

// follow reads lock name's events from the grant's revision on, on the
// client's current member (the next one when it fails), until the grant
// ends or following stops.
func (g *grantEnd) follow(name string, permits uint32, key string, token int64) {
	client := g.session.client
	start := token
	if start < 1 {
		start = 1
	}
	for g.ctx.Err() == nil {
		index, conn, err := client.conn()
		if isCode(err, codes.Canceled) {
			return // the client is closed
		}
		usedToken := ""
		if err == nil {
			req := &lockpb.ObserveRequest{Name: []byte(name), Permits: permits, StartRevision: start}
			var stream lockpb.Locks_ObserveClient
			var outgoing context.Context
			outgoing, usedToken = client.outgoing(g.ctx)
			stream, err = lockpb.NewLocksClient(conn).Observe(outgoing, req)
			for err == nil {
				var message *lockpb.ObserveResponse
				if message, err = stream.Recv(); err != nil {
					break
				}
				if why := g.endIn(message, key, token, start == 0); why != nil {
					if why.Reason == endReasons[lockpb.LockEvent_ENDED] {
						g.causeFromLease(why)
					}
					g.lose(why, true)
					return
				}
				if next := message.Header.GetRevision() + 1; next > start {
					start = next
				}
			}
		}
		if g.ctx.Err() != nil {
			return
		}
		switch code := status.Code(err); {
		case code == codes.OutOfRange: // compacted: start from the lock as it is
			start = 0
			continue
		case client.refusedToken(err):
			if err := client.reauthenticate(g.ctx, usedToken); err != nil && g.ctx.Err() == nil {
				client.nextEndpoint(index)
			}
		case code == codes.Unavailable, code == codes.Unknown, code == codes.DeadlineExceeded, code == codes.Canceled:
			client.nextEndpoint(index)
		default:
			g.lose(&LostError{Lease: g.session.lease, Key: key, Token: token, Reason: "its events could not be followed: " + fromRPC(err).Error()}, false)
			return
		}
		select {
		case <-g.ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}
