//! raftlock with other programs' clients: etcdctl 3.4 and 3.5, Go clientv3
//! and its `concurrency` Mutex and Election (the Go program under `go/`),
//! and python-etcd3 (`etcd3_locks.py`).

use raftlock_testkit as common;

mod etcdctl;
mod go_clientv3;
mod python_etcd3;
