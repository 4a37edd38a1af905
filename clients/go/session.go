package raftlock

// Sessions: a lease kept alive in the background, renewed every third of
// its TTL on whichever member answers. Locks and elections are taken
// through a session; each grant's Lost channel is closed when the grant
// ends without its holder releasing it (see lock.go), and every grant of a
// session whose lease could not be renewed before its TTL ran out is lost
// with it.
//
// Invariants: Lost channels are closed once and stay closed; a session's
// Close revokes its lease, which ends every grant under it (those are
// released, not lost).

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"raftlock/lockpb"
)

// A Session is a lease kept alive in the background until Close, or until
// it is lost (Lost is closed; Err says why).
type Session struct {
	client *Client
	lease  int64
	ttl    time.Duration

	lost       chan struct{}
	closing    chan struct{}
	keeperDone chan struct{}

	mu     sync.Mutex
	err    error
	closed bool
	grants map[*grantEnd]struct{}
}

// Session grants a lease of ttl (whole seconds, at least one) and keeps it
// alive until Close.
func (c *Client) Session(ctx context.Context, ttl time.Duration) (*Session, error) {
	seconds := int64(ttl / time.Second)
	if seconds < 1 || ttl%time.Second != 0 {
		return nil, &Error{Code: codes.InvalidArgument, Message: "a session's TTL is a whole number of seconds, at least one"}
	}
	resp := &lockpb.LeaseGrantResponse{}
	if err := c.call(ctx, methodLeaseGrant, &lockpb.LeaseGrantRequest{TTL: seconds}, resp); err != nil {
		return nil, err
	}
	s := &Session{
		client:     c,
		lease:      resp.ID,
		ttl:        time.Duration(resp.TTL) * time.Second,
		lost:       make(chan struct{}),
		closing:    make(chan struct{}),
		keeperDone: make(chan struct{}),
		grants:     map[*grantEnd]struct{}{},
	}
	go s.keepAlive()
	return s, nil
}

// Lease is the session's lease ID.
func (s *Session) Lease() int64 { return s.lease }

// TTL is the lease's granted TTL.
func (s *Session) TTL() time.Duration { return s.ttl }

// Lost is closed when the session's lease ended without Close.
func (s *Session) Lost() <-chan struct{} { return s.lost }

// Err says why the session was lost (a *LostError, matching
// ErrSessionLost), or nil.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Session) keepAlive() {
	defer close(s.keeperDone)
	renewed := time.Now()
	tick := time.NewTicker(s.ttl / 3)
	defer tick.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.ttl/3)
		ttl, err := s.client.keepAliveOnce(ctx, s.lease)
		cancel()
		switch {
		case err != nil:
			if time.Since(renewed) >= s.ttl {
				s.lose("not renewed for its TTL (" + s.ttl.String() + "): " + err.Error())
				return
			}
		case ttl <= 0:
			s.lose("the lease no longer exists (expired or revoked)")
			return
		default:
			renewed = time.Now()
		}
	}
}

func (s *Session) lose(reason string) {
	s.mu.Lock()
	if s.closed || s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = &LostError{Lease: s.lease, Reason: reason}
	close(s.lost)
	grants := make([]*grantEnd, 0, len(s.grants))
	for g := range s.grants {
		grants = append(grants, g)
	}
	s.mu.Unlock()
	for _, g := range grants {
		g.lose("session lost: "+reason, false)
	}
}

// usable is nil, or the error a lost or closed session answers with.
func (s *Session) usable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.closed {
		return &Error{Code: codes.Canceled, Message: "the session is closed"}
	}
	return nil
}

func (s *Session) track(g *grantEnd) {
	s.mu.Lock()
	s.grants[g] = struct{}{}
	s.mu.Unlock()
}

func (s *Session) untrack(g *grantEnd) {
	s.mu.Lock()
	delete(s.grants, g)
	s.mu.Unlock()
}

// Close ends the session: it stops renewing and revokes the lease, which
// releases every grant taken through it. A lease already gone is not an
// error.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	grants := make([]*grantEnd, 0, len(s.grants))
	for g := range s.grants {
		grants = append(grants, g)
	}
	s.mu.Unlock()
	close(s.closing)
	<-s.keeperDone
	for _, g := range grants {
		g.stopFollowing()
	}
	err := s.client.RevokeLease(ctx, s.lease)
	if isCode(err, codes.NotFound) {
		return nil
	}
	return err
}

// Leader: see Client.Leader. Campaign makes this session a candidate in
// election name with value (etcd's Election.Campaign) and returns once it
// leads, or with ctx's error. Candidates lead in the order they campaigned.
func (s *Session) Campaign(ctx context.Context, name, value string) (*Leadership, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	resp := &lockpb.CampaignResponse{}
	req := &lockpb.CampaignRequest{Name: []byte(name), Lease: s.lease, Value: []byte(value)}
	if err := s.client.invoke(ctx, methodCampaign, req, resp, 0, s.client.opts.user != ""); err != nil {
		return nil, err
	}
	lock := newLock(s, name, 1, string(resp.Leader.Key), resp.Leader.Rev, 1)
	return &Leadership{Lock: lock, leader: resp.Leader}, nil
}

// A Leadership: this session leads an election. Key and Token are the
// leader key and its revision (a fencing token, as a lock's); Lost tells
// that it ended without Resign.
type Leadership struct {
	*Lock
	leader *lockpb.LeaderKey
}

// Proclaim tells a new value as the leader (refused once leadership is lost).
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	req := &lockpb.ProclaimRequest{Leader: l.leader, Value: []byte(value)}
	return l.session.client.call(ctx, methodProclaim, req, &lockpb.ProclaimResponse{})
}

// Resign gives up leadership; the next candidate leads.
func (l *Leadership) Resign(ctx context.Context) error {
	l.end.mu.Lock()
	l.end.released = true
	l.end.mu.Unlock()
	l.end.stopFollowing()
	return l.session.client.call(ctx, methodResign, &lockpb.ResignRequest{Leader: l.leader}, &lockpb.ResignResponse{})
}

// Release of a Leadership is Resign.
func (l *Leadership) Release(ctx context.Context) (bool, error) {
	if err := l.Resign(ctx); err != nil {
		return false, err
	}
	return true, nil
}
