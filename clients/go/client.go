// Package raftlock is the Go client of raftlock's native lock API: fenced
// locks and semaphores with try-lock and wait timeouts, read-write and
// reentrant holds, lock-delay, multi-locks, token validation,
// introspection (Describe, List, Observe), and elections — for Go programs
// that use etcd's clientv3 for everything else. It links beside clientv3:
// the etcd messages it needs are copies of etcd's under a package of its
// own (see clients/go/proto).
//
// A Client holds one gRPC connection per endpoint. A call goes to the
// endpoint that answered last; when that member cannot be reached
// (Unavailable) the call is made again on the next endpoint, each endpoint
// tried once per call, and an error wrapping ErrUnavailable is returned
// when none answered. Every other failure is returned at once as an *Error
// carrying the gRPC code and the server's message (etcd's, for the etcd
// calls).
//
// A call that may be made twice (reads, keepalives, Describe, Validate)
// also moves on when a member does not answer within the client's timeout
// (a member that hangs); gRPC keepalives find a silent connection within
// 15 s. A refused auth token (tokens are each member's own) is replaced
// and the call made again.
//
// Caveat: an Acquire whose member went away after it was sent may have been
// applied; retrying it (which the client does on Unavailable) is safe — a
// plain acquire by a lease that already holds or waits for the lock finds
// its own place — but a reentrant acquire retried may add a hold twice (its
// answer says how many there are). A Release is never retried (see
// Client.Release).
package raftlock

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"raftlock/lockpb"
)

// etcd's and raftlock's method names, as the members serve them.
const (
	methodAuthenticate   = "/etcdserverpb.Auth/Authenticate"
	methodLeaseGrant     = "/etcdserverpb.Lease/LeaseGrant"
	methodLeaseRevoke    = "/etcdserverpb.Lease/LeaseRevoke"
	methodLeaseKeepAlive = "/etcdserverpb.Lease/LeaseKeepAlive"
	methodLeaseTTL       = "/etcdserverpb.Lease/LeaseTimeToLive"
	methodCampaign       = "/v3electionpb.Election/Campaign"
	methodProclaim       = "/v3electionpb.Election/Proclaim"
	methodLeader         = "/v3electionpb.Election/Leader"
	methodResign         = "/v3electionpb.Election/Resign"
	methodAcquire        = "/raftlock.v1.Locks/Acquire"
	methodRelease        = "/raftlock.v1.Locks/Release"
	methodDescribe       = "/raftlock.v1.Locks/Describe"
	methodList           = "/raftlock.v1.Locks/List"
	methodValidate       = "/raftlock.v1.Locks/Validate"
)

// An Option configures Connect.
type Option func(*options)

type options struct {
	tls      *tls.Config
	user     string
	password string
	timeout  time.Duration
	dial     []grpc.DialOption
}

// WithTLS makes every connection TLS with this configuration (its
// Certificates for mTLS). An endpoint given as https://host:port turns TLS
// on with the system's roots when this option is absent.
func WithTLS(config *tls.Config) Option {
	return func(o *options) { o.tls = config }
}

// WithAuth authenticates as this user (etcd's simple tokens), and again
// whenever the token is refused.
func WithAuth(user, password string) Option {
	return func(o *options) { o.user, o.password = user, password }
}

// WithTimeout bounds each attempt of a call on one member (5 s unless set;
// a lock's wait is added to it); the call's context bounds the whole call.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// WithDialOptions adds gRPC dial options to every connection.
func WithDialOptions(dial ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, dial...) }
}

// A Client of a raftlock cluster; safe for concurrent use.
type Client struct {
	endpoints []string
	opts      options

	authMu sync.Mutex // one re-authentication at a time

	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	current int
	token   string
	closed  bool
}

// Connect makes a client of the members at endpoints ("host:port",
// "http://host:port" or "https://host:port"). Connections are made as
// calls need them; with WithAuth, Connect authenticates first.
func Connect(ctx context.Context, endpoints []string, opts ...Option) (*Client, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("raftlock: at least one endpoint is needed")
	}
	o := options{timeout: 5 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	c := &Client{opts: o, conns: map[string]*grpc.ClientConn{}}
	for _, e := range endpoints {
		if strings.HasPrefix(e, "https://") && c.opts.tls == nil {
			c.opts.tls = &tls.Config{}
		}
		if i := strings.Index(e, "://"); i >= 0 {
			e = e[i+3:]
		}
		c.endpoints = append(c.endpoints, e)
	}
	if o.user != "" {
		if err := c.authenticate(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Endpoints are the members' addresses, as host:port.
func (c *Client) Endpoints() []string {
	return append([]string(nil), c.endpoints...)
}

// Close closes every connection. Sessions made through the client stop
// being renewed (close them first to revoke their leases).
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var first error
	for e, conn := range c.conns {
		if err := conn.Close(); err != nil && first == nil {
			first = err
		}
		delete(c.conns, e)
	}
	return first
}

// conn is the current endpoint's connection, made if needed; with the
// endpoint's index.
func (c *Client) conn() (int, *grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, nil, &Error{Code: codes.Canceled, Message: "the client is closed"}
	}
	i := c.current
	endpoint := c.endpoints[i]
	if conn, ok := c.conns[endpoint]; ok {
		return i, conn, nil
	}
	dial := append([]grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.ForceCodec(codec{})),
		// A member that hangs (stopped, cut off) is found by its silence:
		// its connection fails, and with it the streams that follow locks.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
	}, c.opts.dial...)
	if c.opts.tls != nil {
		dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(c.opts.tls.Clone())))
	} else {
		dial = append(dial, grpc.WithInsecure())
	}
	conn, err := grpc.Dial(endpoint, dial...)
	if err != nil {
		return i, nil, &Error{Code: codes.Unavailable, Message: err.Error()}
	}
	c.conns[endpoint] = conn
	return i, conn, nil
}

// nextEndpoint: the member at index failed a call or a stream; the next
// one becomes current (unless another call moved on already).
func (c *Client) nextEndpoint(index int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current == index {
		c.current = (c.current + 1) % len(c.endpoints)
	}
}

// outgoing adds the auth token, if any, to a call's context; with the
// token used ("" for none).
func (c *Client) outgoing(ctx context.Context) (context.Context, string) {
	c.mu.Lock()
	token := c.token
	c.mu.Unlock()
	if token == "" {
		return ctx, ""
	}
	return metadata.AppendToOutgoingContext(ctx, "token", token), token
}

// authenticate fetches a token; the one in use is replaced only by a new
// one, never cleared.
func (c *Client) authenticate(ctx context.Context) error {
	resp := &lockpb.AuthenticateResponse{}
	req := &lockpb.AuthenticateRequest{Name: c.opts.user, Password: c.opts.password}
	if err := c.failover(ctx, c.opts.timeout, retryUnavailable, false, invoker(methodAuthenticate, req, resp)); err != nil {
		return err
	}
	c.mu.Lock()
	c.token = resp.Token
	c.mu.Unlock()
	return nil
}

// reauthenticate replaces token stale, which a member refused (tokens are
// the member's own: one that answered before a failover may not know it),
// unless another call replaced it meanwhile. One at a time.
func (c *Client) reauthenticate(ctx context.Context, stale string) error {
	c.authMu.Lock()
	defer c.authMu.Unlock()
	c.mu.Lock()
	current := c.token
	c.mu.Unlock()
	if current != stale {
		return nil
	}
	return c.authenticate(ctx)
}

// refusedToken tells whether err is a member refusing the auth token.
func (c *Client) refusedToken(err error) bool {
	s, _ := status.FromError(err)
	return c.opts.user != "" && s.Code() == codes.Unauthenticated && strings.Contains(s.Message(), "token")
}

// retry says when a call is made again on the next endpoint.
type retry int

const (
	// When its member cannot be reached (Unavailable): reads, grants,
	// acquires (a lease that holds or waits finds its own place again).
	retryUnavailable retry = iota
	// Also when the client's own deadline for one attempt passes (a member
	// that hangs): calls that may be made twice.
	retryAlways
	// Never: a fenced release, which a retry could make give back a second
	// hold. Its caller learns that the answer was lost.
	retryNever
)

// An attempt makes a call on one member's connection.
type attempt func(ctx context.Context, conn *grpc.ClientConn) error

func invoker(method string, req, resp proto.Message) attempt {
	return func(ctx context.Context, conn *grpc.ClientConn) error { return conn.Invoke(ctx, method, req, resp) }
}

// failover makes one call, on the current endpoint and then the next ones
// as policy allows, each endpoint once; a refused token is replaced once.
// timeout bounds each attempt (0: unbounded), ctx the whole call.
func (c *Client) failover(ctx context.Context, timeout time.Duration, policy retry, mayReauthenticate bool, call attempt) error {
	var last error
	for tries := 0; tries < len(c.endpoints); {
		index, conn, err := c.conn()
		if err != nil {
			if isCode(err, codes.Canceled) {
				return err
			}
			last = err
			c.nextEndpoint(index)
			tries++
			continue
		}
		callCtx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			callCtx, cancel = context.WithTimeout(ctx, timeout)
		}
		outgoing, token := c.outgoing(callCtx)
		err = call(outgoing, conn)
		ownDeadline := callCtx.Err() == context.DeadlineExceeded && ctx.Err() == nil
		cancel()
		if err == nil {
			return nil
		}
		last = err
		switch code := status.Code(err); {
		case mayReauthenticate && c.refusedToken(err):
			mayReauthenticate = false
			if err := c.reauthenticate(ctx, token); err != nil {
				return err
			}
		case code == codes.Unavailable && policy != retryNever,
			code == codes.DeadlineExceeded && ownDeadline && policy == retryAlways:
			c.nextEndpoint(index)
			tries++
		case code == codes.Unavailable || (code == codes.DeadlineExceeded && ownDeadline):
			c.nextEndpoint(index) // the next call goes elsewhere
			return fromRPC(err)
		default:
			return fromRPC(err)
		}
	}
	return noneAnswered(last)
}

// invoke makes one unary call with failover (see failover).
func (c *Client) invoke(ctx context.Context, method string, req, resp proto.Message, timeout time.Duration, policy retry) error {
	return c.failover(ctx, timeout, policy, c.opts.user != "", invoker(method, req, resp))
}

// call is invoke with the client's timeout, for a call that may be made
// twice.
func (c *Client) call(ctx context.Context, method string, req, resp proto.Message) error {
	return c.invoke(ctx, method, req, resp, c.opts.timeout, retryAlways)
}

// Describe tells who holds lock name and who waits for it (permits 0
// means 1), with their leases' TTLs.
//
// The server answers a page of waiters at a time (1,000); Describe asks for
// the pages that follow until it has them all, so they come from several
// reads when the queue is long (each page past the last waiter of the one
// before).
func (c *Client) Describe(ctx context.Context, name string, permits uint32) (*lockpb.DescribeResponse, error) {
	resp := &lockpb.DescribeResponse{}
	req := &lockpb.DescribeRequest{Name: []byte(name), Permits: permits}
	if err := c.call(ctx, methodDescribe, req, resp); err != nil {
		return resp, err
	}
	for resp.More && len(resp.Waiters) > 0 {
		next := &lockpb.DescribeResponse{}
		last := resp.Waiters[len(resp.Waiters)-1]
		req.WaitersAfter, req.WaitersAfterKey = last.Token, last.Key
		if err := c.call(ctx, methodDescribe, req, next); err != nil {
			return resp, err
		}
		resp.Waiters = append(resp.Waiters, next.Waiters...)
		resp.More = next.More
	}
	return resp, nil
}

// List tells every lock whose name starts with prefix, with its holders
// and how many wait. The server answers up to 1,000 locks at a time; List
// asks for every page (each read at its own revision: see ListRequest).
func (c *Client) List(ctx context.Context, prefix string, permits uint32) ([]*lockpb.LockSummary, error) {
	var locks []*lockpb.LockSummary
	req := &lockpb.ListRequest{Prefix: []byte(prefix), Permits: permits}
	for {
		resp := &lockpb.ListResponse{}
		if err := c.call(ctx, methodList, req, resp); err != nil {
			return locks, err
		}
		locks = append(locks, resp.Locks...)
		if len(resp.NextPage) == 0 {
			return locks, nil
		}
		req.Page = resp.NextPage
	}
}

// Validate tells, read linearizably, whether the grant (key, token) still
// holds its lock, with its lease's time left: for a resource that cannot
// keep the highest token it has seen.
func (c *Client) Validate(ctx context.Context, key string, token int64, permits uint32) (*lockpb.ValidateResponse, error) {
	resp := &lockpb.ValidateResponse{}
	err := c.call(ctx, methodValidate, &lockpb.ValidateRequest{Key: []byte(key), Token: token, Permits: permits}, resp)
	return resp, err
}

// Release gives back one hold of the grant (key, token), fenced by the
// token: nothing changes when the key is gone or belongs to a later grant.
// It is made once: when its member cannot be reached or does not answer
// in time, the error says so (an Unavailable or DeadlineExceeded *Error)
// and the release may or may not have been applied — a second Release
// answers false if it was (and, for a reentrant grant, would otherwise
// give back a second hold). A Lock's own Release is this, with its
// lost-lock bookkeeping.
func (c *Client) Release(ctx context.Context, key string, token int64) (*lockpb.ReleaseResponse, error) {
	resp := &lockpb.ReleaseResponse{}
	req := &lockpb.ReleaseRequest{Key: []byte(key), Token: token}
	err := c.invoke(ctx, methodRelease, req, resp, c.opts.timeout, retryNever)
	return resp, err
}

// Observe follows lock name's events on the current member (no failover:
// a stream that ends is resumed by the caller from the revision after the
// last message's header, as a Lock does for its own grant).
func (c *Client) Observe(ctx context.Context, req *lockpb.ObserveRequest) (lockpb.Locks_ObserveClient, error) {
	_, conn, err := c.conn()
	if err != nil {
		return nil, err
	}
	outgoing, _ := c.outgoing(ctx)
	stream, err := lockpb.NewLocksClient(conn).Observe(outgoing, req)
	if err != nil {
		return nil, fromRPC(err)
	}
	return stream, nil
}

// Leader is election name's leader key (its value the leader's
// proclamation), or nil when nobody leads.
func (c *Client) Leader(ctx context.Context, name string) (*lockpb.KeyValue, error) {
	resp := &lockpb.LeaderResponse{}
	err := c.call(ctx, methodLeader, &lockpb.LeaderRequest{Name: []byte(name)}, resp)
	var e *Error
	if errors.As(err, &e) && e.Message == "election: no leader" {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return resp.Kv, nil
}

// RevokeLease revokes a lease (a session's, say) from this client: every
// grant under it ends.
func (c *Client) RevokeLease(ctx context.Context, lease int64) error {
	req := &lockpb.LeaseRevokeRequest{ID: lease}
	return c.invoke(ctx, methodLeaseRevoke, req, &lockpb.LeaseRevokeResponse{}, c.opts.timeout, retryUnavailable)
}

// LeaseTTL is the seconds left on a lease, or -1 when it does not exist.
func (c *Client) LeaseTTL(ctx context.Context, lease int64) (int64, error) {
	resp := &lockpb.LeaseTimeToLiveResponse{}
	if err := c.call(ctx, methodLeaseTTL, &lockpb.LeaseTimeToLiveRequest{ID: lease}, resp); err != nil {
		return 0, err
	}
	return resp.TTL, nil
}

// keepAliveOnce renews a lease once: its TTL in seconds, or 0 when it no
// longer exists. A member that hangs is left for the next one.
func (c *Client) keepAliveOnce(ctx context.Context, lease int64, attemptTimeout time.Duration) (int64, error) {
	var ttl int64
	err := c.failover(ctx, attemptTimeout, retryAlways, c.opts.user != "", func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		ttl, err = renew(ctx, conn, lease)
		return err
	})
	return ttl, err
}

func renew(ctx context.Context, conn *grpc.ClientConn, lease int64) (int64, error) {
	desc := &grpc.StreamDesc{StreamName: "LeaseKeepAlive", ServerStreams: true, ClientStreams: true}
	stream, err := conn.NewStream(ctx, desc, methodLeaseKeepAlive)
	if err != nil {
		return 0, err
	}
	if err := stream.SendMsg(&lockpb.LeaseKeepAliveRequest{ID: lease}); err != nil {
		return 0, err
	}
	if err := stream.CloseSend(); err != nil {
		return 0, err
	}
	resp := &lockpb.LeaseKeepAliveResponse{}
	if err := stream.RecvMsg(resp); err == io.EOF {
		return 0, nil // ended without an answer: the lease is gone
	} else if err != nil {
		return 0, err
	}
	return resp.TTL, nil
}
