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
// Caveat: an Acquire whose member went away after it was sent may have been
// applied; retrying it (which the client does on Unavailable) is safe — a
// plain acquire by a lease that already holds or waits for the lock finds
// its own place — but a reentrant acquire retried may add a hold twice (its
// answer says how many there are).
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

// WithTimeout sets each call's deadline (5 s unless set) when its context
// has none; a lock's wait is added to it.
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
	dial := append([]grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.ForceCodec(codec{}))}, c.opts.dial...)
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

// outgoing adds the auth token, if any, to a call's context.
func (c *Client) outgoing(ctx context.Context) context.Context {
	c.mu.Lock()
	token := c.token
	c.mu.Unlock()
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "token", token)
}

func (c *Client) authenticate(ctx context.Context) error {
	c.mu.Lock()
	c.token = ""
	c.mu.Unlock()
	resp := &lockpb.AuthenticateResponse{}
	req := &lockpb.AuthenticateRequest{Name: c.opts.user, Password: c.opts.password}
	if err := c.invoke(ctx, methodAuthenticate, req, resp, c.opts.timeout, false); err != nil {
		return err
	}
	c.mu.Lock()
	c.token = resp.Token
	c.mu.Unlock()
	return nil
}

// judgement is what a failed call does next.
type judgement int

const (
	giveUp judgement = iota
	tryNext
	reauthenticate
)

func (c *Client) judge(err error, index int, mayReauthenticate bool) judgement {
	s, _ := status.FromError(err)
	switch {
	case s.Code() == codes.Unavailable:
		c.nextEndpoint(index)
		return tryNext
	case s.Code() == codes.Unauthenticated && c.opts.user != "" && mayReauthenticate && strings.Contains(s.Message(), "token"):
		return reauthenticate
	}
	return giveUp
}

// invoke makes one unary call, failing over to the next endpoint while
// members cannot be reached. timeout bounds the call when ctx has no
// deadline (0: unbounded).
func (c *Client) invoke(ctx context.Context, method string, req, resp proto.Message, timeout time.Duration, mayReauthenticate bool) error {
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
		if _, has := ctx.Deadline(); !has && timeout > 0 {
			callCtx, cancel = context.WithTimeout(ctx, timeout)
		}
		err = conn.Invoke(c.outgoing(callCtx), method, req, resp)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		switch c.judge(err, index, mayReauthenticate) {
		case tryNext:
			tries++
		case reauthenticate:
			mayReauthenticate = false
			if err := c.authenticate(ctx); err != nil {
				return err
			}
		default:
			return fromRPC(err)
		}
	}
	return noneAnswered(last)
}

// call is invoke with the client's timeout, reauthenticating once.
func (c *Client) call(ctx context.Context, method string, req, resp proto.Message) error {
	return c.invoke(ctx, method, req, resp, c.opts.timeout, c.opts.user != "")
}

// Describe tells who holds lock name and who waits for it (permits 0
// means 1), with their leases' TTLs.
func (c *Client) Describe(ctx context.Context, name string, permits uint32) (*lockpb.DescribeResponse, error) {
	resp := &lockpb.DescribeResponse{}
	err := c.call(ctx, methodDescribe, &lockpb.DescribeRequest{Name: []byte(name), Permits: permits}, resp)
	return resp, err
}

// List tells every lock whose name starts with prefix, with its holders
// and how many wait.
func (c *Client) List(ctx context.Context, prefix string, permits uint32) ([]*lockpb.LockSummary, error) {
	resp := &lockpb.ListResponse{}
	err := c.call(ctx, methodList, &lockpb.ListRequest{Prefix: []byte(prefix), Permits: permits}, resp)
	return resp.Locks, err
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
// A Lock's own Release is this, with its lost-lock bookkeeping.
func (c *Client) Release(ctx context.Context, key string, token int64) (*lockpb.ReleaseResponse, error) {
	resp := &lockpb.ReleaseResponse{}
	err := c.call(ctx, methodRelease, &lockpb.ReleaseRequest{Key: []byte(key), Token: token}, resp)
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
	stream, err := lockpb.NewLocksClient(conn).Observe(c.outgoing(ctx), req)
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
	return c.call(ctx, methodLeaseRevoke, &lockpb.LeaseRevokeRequest{ID: lease}, &lockpb.LeaseRevokeResponse{})
}

// keepAliveOnce renews a lease once: its TTL in seconds, or 0 when it no
// longer exists.
func (c *Client) keepAliveOnce(ctx context.Context, lease int64) (int64, error) {
	var last error
	for tries := 0; tries < len(c.endpoints); {
		index, conn, err := c.conn()
		if err != nil {
			if isCode(err, codes.Canceled) {
				return 0, err
			}
			last = err
			c.nextEndpoint(index)
			tries++
			continue
		}
		ttl, err := renew(c.outgoing(ctx), conn, lease, c.opts.timeout)
		if err == nil {
			return ttl, nil
		}
		last = err
		if c.judge(err, index, false) != tryNext {
			return 0, fromRPC(err)
		}
		tries++
	}
	return 0, noneAnswered(last)
}

func renew(ctx context.Context, conn *grpc.ClientConn, lease int64, timeout time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
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
