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
	// The grants followed, by owner key and token: every handle on one
	// grant (a lock acquired again, reentrant or not) shares its end.
	grants map[grantID]*grantEnd
}

type grantID struct {
	key   string
	token int64
}

// Session grants a lease of ttl (whole seconds, at least one) and keeps it
// alive until Close.
func (c *Client) Session(ctx context.Context, ttl time.Duration) (*Session, error) {
	seconds := int64(ttl / time.Second)
	if seconds < 1 || ttl%time.Second != 0 {
		return nil, &Error{Code: codes.InvalidArgument, Message: "a session's TTL is a whole number of seconds, at least one"}
	}
	resp := &lockpb.LeaseGrantResponse{}
	if err := c.invoke(ctx, methodLeaseGrant, &lockpb.LeaseGrantRequest{TTL: seconds}, resp, c.opts.timeout, retryUnavailable); err != nil {
		return nil, err
	}
	s := &Session{
		client:     c,
		lease:      resp.ID,
		ttl:        time.Duration(resp.TTL) * time.Second,
		lost:       make(chan struct{}),
		closing:    make(chan struct{}),
		keeperDone: make(chan struct{}),
		grants:     map[grantID]*grantEnd{},
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
	// The lease lives at least until renewed + TTL: renewed is when the
	// last renewal that was answered was sent.
	renewed := time.Now()
	for {
		wait := s.ttl / 3
		if left := time.Until(renewed.Add(s.ttl)); left < wait {
			wait = left
		}
		timer := time.NewTimer(wait)
		select {
		case <-s.closing:
			timer.Stop()
			return
		case <-timer.C:
		}
		if time.Since(renewed) >= s.ttl {
			s.lose("not renewed for its TTL (" + s.ttl.String() + ")")
			return
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Until(renewed.Add(s.ttl)))
		// Each member gets a third of the TTL at most: a member that hangs
		// leaves time to ask the others.
		attempt := s.ttl / 3
		if s.client.opts.timeout < attempt {
			attempt = s.client.opts.timeout
		}
		ttl, err := s.client.keepAliveOnce(ctx, s.lease, attempt)
		cancel()
		switch {
		case err != nil:
			if time.Since(renewed) >= s.ttl {
				s.lose("not renewed for its TTL (" + s.ttl.String() + "): " + err.Error())
				return
			}
		case ttl <= 0:
			s.lose("its lease ended (expired or revoked)")
			return
		default:
			renewed = sent
		}
	}
}

func (s *Session) lose(reason string) {
	s.mu.Lock()
	if s.closed || s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = &LostError{Lease: s.lease, Reason: reason, Session: true}
	close(s.lost)
	grants := make([]*grantEnd, 0, len(s.grants))
	for _, g := range s.grants {
		grants = append(grants, g)
	}
	s.mu.Unlock()
	for _, g := range grants {
		g.loseWithSession(reason)
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

// end is the end of grant (key, token), followed on lock name: the one
// the session has if a handle on it is live, else a new one. A grant
// answered after Close began is ended with the session (released, not
// followed).
func (s *Session) end(name string, permits uint32, key string, token int64) *grantEnd {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := grantID{key, token}
	if g, ok := s.grants[id]; ok {
		return g
	}
	g := newGrantEnd(s, key, token)
	if s.closed {
		g.released = true
		g.stop()
		return g
	}
	g.ids = []grantID{id}
	s.grants[id] = g
	go g.follow(name, permits, key, token)
	return g
}

// multiEnd is the end of a multi-lock's grants (one for the set), followed
// on each of its locks; as end does, ended at once after Close began.
func (s *Session) multiEnd(specs []LockSpec, grants []Grant) *grantEnd {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := newGrantEnd(s, grants[0].Key, grants[0].Token)
	if s.closed {
		g.released = true
		g.stop()
		return g
	}
	for i, grant := range grants {
		id := grantID{grant.Key, grant.Token}
		g.ids = append(g.ids, id)
		s.grants[id] = g
		permits := specs[i].Permits
		if permits == 0 {
			permits = 1
		}
		go g.follow(grant.Name, permits, grant.Key, grant.Token)
	}
	return g
}

// untrack forgets a grant that ended (a new acquire of it makes a new end).
func (s *Session) untrack(g *grantEnd) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range g.ids {
		if s.grants[id] == g {
			delete(s.grants, id)
		}
	}
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
	for _, g := range s.grants {
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

// Campaign makes this session a candidate in election name with value
// (etcd's Election.Campaign) and returns once it leads, or with ctx's
// error. Candidates lead in the order they campaigned.
func (s *Session) Campaign(ctx context.Context, name, value string) (*Leadership, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	resp := &lockpb.CampaignResponse{}
	req := &lockpb.CampaignRequest{Name: []byte(name), Lease: s.lease, Value: []byte(value)}
	if err := s.client.invoke(ctx, methodCampaign, req, resp, 0, retryUnavailable); err != nil {
		return nil, err
	}
	key, token := string(resp.Leader.Key), resp.Leader.Rev
	return &Leadership{session: s, name: name, leader: resp.Leader, end: s.end(name, 1, key, token)}, nil
}

// A Leadership: this session leads an election. Key and Token are the
// leader key and its revision (a fencing token, as a lock's); Lost tells
// that it ended without Resign.
type Leadership struct {
	session *Session
	name    string
	leader  *lockpb.LeaderKey
	end     *grantEnd
}

// Name is the election's name.
func (l *Leadership) Name() string { return l.name }

// Key is the leader key, "<name>/<lease hex>".
func (l *Leadership) Key() string { return string(l.leader.Key) }

// Token is the leader key's revision: greater for every later leader.
func (l *Leadership) Token() int64 { return l.leader.Rev }

// Lost is closed when the leadership ended without Resign.
func (l *Leadership) Lost() <-chan struct{} { return l.end.lost }

// Err says why the leadership was lost, or nil.
func (l *Leadership) Err() error { return l.end.error() }

// Validate tells, read linearizably, whether this session still leads.
func (l *Leadership) Validate(ctx context.Context) (bool, error) {
	resp, err := l.session.client.Validate(ctx, l.Key(), l.Token(), 1)
	if err != nil {
		return false, err
	}
	return resp.Current, nil
}

// Proclaim tells a new value as the leader (refused once leadership is lost).
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	req := &lockpb.ProclaimRequest{Leader: l.leader, Value: []byte(value)}
	return l.session.client.call(ctx, methodProclaim, req, &lockpb.ProclaimResponse{})
}

// Resign gives up leadership; the next candidate leads. If it fails, the
// session may still lead (and Lost still tells if that ends).
func (l *Leadership) Resign(ctx context.Context) error {
	l.end.releaseStarts()
	err := l.session.client.call(ctx, methodResign, &lockpb.ResignRequest{Leader: l.leader}, &lockpb.ResignResponse{})
	l.end.releaseEnded(err == nil, 0)
	return err
}
