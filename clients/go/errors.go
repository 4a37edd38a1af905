package raftlock

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"raftlock/lockpb"
)

// Errors to test for with errors.Is.
var (
	// ErrUnavailable: no member answered (every endpoint was tried).
	ErrUnavailable = errors.New("raftlock: no member answered")
	// ErrBusy: a lock was not granted within its wait (the error is a
	// *BusyError, with the holders).
	ErrBusy = errors.New("raftlock: lock busy")
	// ErrSessionLost: the session's lease ended (expired, or revoked by
	// someone else).
	ErrSessionLost = errors.New("raftlock: session lost")
	// ErrLockLost: a grant ended without its holder releasing it.
	ErrLockLost = errors.New("raftlock: lock lost")
)

// Error is a failed call: the gRPC code and the server's message, which is
// etcd's own for the etcd API ("etcdserver: requested lease not found").
type Error struct {
	Code    codes.Code
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("raftlock: %s: %s", e.Code, e.Message) }

// GRPCStatus lets status.Code and status.Convert read the error.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// Is matches ErrUnavailable for an Unavailable call, and context.Canceled
// and context.DeadlineExceeded for a call whose context ended.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrUnavailable:
		return e.Code == codes.Unavailable
	case context.Canceled:
		return e.Code == codes.Canceled
	case context.DeadlineExceeded:
		return e.Code == codes.DeadlineExceeded
	}
	return false
}

// BusyError: lock Name was not granted within the wait; Holders hold it now,
// lowest token first (for a multi-lock, the holders of BlockedOn, the first
// lock of the set that was not held).
type BusyError struct {
	Name    string
	Holders []*lockpb.Owner
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("raftlock: lock %q is held by %d other owner(s)", e.Name, len(e.Holders))
}

func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// GRPCStatus: a busy lock reads as Aborted, as the Python client's does.
func (e *BusyError) GRPCStatus() *status.Status { return status.New(codes.Aborted, e.Error()) }

// LostError says why a session or a grant ended without its holder's asking.
type LostError struct {
	// Lease is the session's lease; Key and Token the grant's (empty for a
	// session).
	Lease  int64
	Key    string
	Token  int64
	Reason string
	// Session: the session was lost (and the grant with it).
	Session bool
	// byRequest: the key was deleted by a request (RELEASED).
	byRequest bool
}

func (e *LostError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("raftlock: session lease %x ended: %s", e.Lease, e.Reason)
	}
	return fmt.Sprintf("raftlock: grant %q (token %d) lost: %s", e.Key, e.Token, e.Reason)
}

// Is matches ErrLockLost for a grant, and ErrSessionLost for a session
// and for a grant lost with its session.
func (e *LostError) Is(target error) bool {
	switch target {
	case ErrLockLost:
		return e.Key != ""
	case ErrSessionLost:
		return e.Session
	}
	return false
}

// fromRPC is the *Error for a failed gRPC call (nil stays nil).
func fromRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*Error); ok {
		return err
	}
	s, _ := status.FromError(err)
	return &Error{Code: s.Code(), Message: s.Message()}
}

func noneAnswered(last error) error {
	why := "none tried"
	if last != nil {
		why = status.Convert(last).Message()
	}
	return &Error{Code: codes.Unavailable, Message: "no endpoint answered (" + why + ")"}
}

func isCode(err error, code codes.Code) bool {
	return status.Code(err) == code
}
