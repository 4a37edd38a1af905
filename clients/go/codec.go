package raftlock

// The client's gRPC codec: every message it sends or reads is marshalled
// with google.golang.org/protobuf (the API its generated code is made for).
// grpc's default codec marshals through github.com/golang/protobuf, which
// before 1.4 cannot handle such messages — and 1.3 is what a program that
// links etcd 3.4's clientv3 (Debian's golang-etcd-server-dev, say) gets.
// Forced on the client's own connections only; the wire is protobuf
// either way (content-subtype "proto").

import (
	"fmt"

	"google.golang.org/protobuf/proto"
)

type codec struct{}

func (codec) Marshal(v interface{}) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("raftlock: cannot marshal %T: not a protobuf message", v)
	}
	return proto.Marshal(m)
}

func (codec) Unmarshal(data []byte, v interface{}) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("raftlock: cannot unmarshal into %T: not a protobuf message", v)
	}
	return proto.Unmarshal(data, m)
}

func (codec) Name() string { return "proto" }
