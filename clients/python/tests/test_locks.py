"""The Python client against a real 3-member cluster: locks, fencing,
sessions that survive their member's death and tell when a lock is lost,
semaphores, read-write and reentrant holds, KV, txn and watch."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

import raftlock
from raftlock import txn


def wait_for(event: threading.Event, seconds: float) -> bool:
    return event.wait(seconds)


def test_try_lock_wait_and_fenced_release(client: raftlock.Client) -> None:
    with client.session(ttl=10) as a, client.session(ttl=10) as b:
        first = a.lock("jobs/nightly", wait=0, metadata="worker-a")
        assert first.key.startswith(b"jobs/nightly/") and first.token > 0
        with pytest.raises(raftlock.LockBusy) as busy:
            b.lock("jobs/nightly", wait=0)
        assert [h.token for h in busy.value.holders] == [first.token]
        assert busy.value.holders[0].metadata == b"worker-a"
        with pytest.raises(raftlock.LockBusy):
            b.lock("jobs/nightly", wait=0.3)

        got = {}
        waiter = threading.Thread(target=lambda: got.setdefault("lock", b.lock("jobs/nightly", wait=10)))
        waiter.start()
        deadline = time.monotonic() + 5
        while not client.describe("jobs/nightly").waiters:
            assert time.monotonic() < deadline, "b never queued"
            time.sleep(0.05)
        assert first.release()
        waiter.join(10)
        second = got["lock"]
        assert second.token > first.token, "a later holder's token is greater"
        # The first holder's grant is over: its release is refused, and
        # does not touch the second grant.
        assert not first.release()
        assert client.validate(second.key, second.token).current
        assert not client.validate(first.key, first.token).current
        assert [h.token for h in client.describe("jobs/nightly").holders] == [second.token]
        assert not first.lost.is_set(), "a released lock is not lost"


def test_semaphores_read_locks_and_reentrant_holds(client: raftlock.Client) -> None:
    sessions = [client.session(ttl=10) for _ in range(3)]
    try:
        s1, s2, s3 = sessions
        held = [s.lock("pool", permits=2, wait=0) for s in (s1, s2)]
        with pytest.raises(raftlock.LockBusy) as busy:
            s3.lock("pool", permits=2, wait=0)
        assert sorted(h.token for h in busy.value.holders) == sorted(h.token for h in held)
        assert [summary.name for summary in client.list_locks("po", permits=2)] == [b"pool"]

        readers = [s.lock("doc", mode=raftlock.READ, wait=0) for s in (s1, s2)]
        assert all(r.key.startswith(b"doc/read-") for r in readers)
        with pytest.raises(raftlock.LockBusy):
            s3.lock("doc", wait=0)
        for r in readers:
            assert r.release()
        writer = s3.lock("doc", wait=0)
        with pytest.raises(raftlock.LockBusy):
            s1.lock("doc", mode=raftlock.READ, wait=0)
        writer.release()

        once = s1.lock("nested", wait=0)
        twice = s1.lock("nested", wait=0, reentrant=True)
        assert (twice.key, twice.token, twice.holds) == (once.key, once.token, 2)
        assert twice.release() and twice.holds == 1
        assert client.describe("nested").holders[0].holds == 1
        assert once.release() and once.holds == 0
        assert not client.describe("nested").holders
        with pytest.raises(ValueError):
            s1.lock("nested", mode="exclusive")
    finally:
        for s in sessions:
            s.close()


def test_a_revoked_lease_sets_lost_and_the_old_token_guards_nothing(client: raftlock.Client) -> None:
    session = client.session(ttl=10)
    lock = session.lock("deploy", wait=0)
    guarded = [txn.create_revision(lock.key, "==", lock.token)]
    assert client.txn(guarded, success=[txn.put("deploy-output", "v1")]).succeeded
    client.lease_revoke(session.lease)
    assert wait_for(lock.lost, 5), "the holder was never told"
    assert "lease ended" in (lock.lost_reason or "")
    assert wait_for(session.lost, 10)
    assert not lock.release()
    with client.session(ttl=10) as other:
        later = other.lock("deploy", wait=5)
        assert later.token > lock.token
        # A write fenced by the old token fails; by the new one it succeeds.
        assert not client.txn(guarded, success=[txn.put("deploy-output", "v2")]).succeeded
        fresh = [txn.create_revision(later.key, "==", later.token)]
        assert client.txn(fresh, success=[txn.put("deploy-output", "v3")]).succeeded
    assert client.get("deploy-output").value == b"v3"
    with pytest.raises(raftlock.SessionLost):
        session.lock("deploy", wait=0)


def test_a_key_deleted_by_someone_else_sets_lost(client: raftlock.Client) -> None:
    with client.session(ttl=10) as session:
        lock = session.lock("report", wait=0)
        assert client.delete(lock.key) == 1
        assert wait_for(lock.lost, 5)
        assert lock.lost_reason == "its key was deleted by another client"
        assert not session.lost.is_set()


def test_a_session_survives_the_death_of_its_member(cluster) -> None:
    client = raftlock.Client(cluster.endpoints, timeout=2.0)
    session = client.session(ttl=3)
    lock = session.lock("survivor", wait=0)
    cluster.kill(0)  # the member the client talked to
    time.sleep(8)  # more than two TTLs: the lease lives only if renewed elsewhere
    assert not session.lost.is_set(), session.lost_reason
    assert not lock.lost.is_set(), lock.lost_reason
    assert [h.token for h in client.describe("survivor").holders] == [lock.token]
    assert lock.release()
    session.close()
    client.close()


HOLDER = """
import sys, raftlock
client = raftlock.Client(sys.argv[1].split(","))
session = client.session(ttl=2)
lock = session.lock("paused", wait=0)
print("token", lock.token, flush=True)
sys.stdin.readline()  # paused and resumed meanwhile
told = lock.lost.wait(10)
print("lost", told, lock.lost_reason, flush=True)
print("released", lock.release(), flush=True)
"""


def test_a_holder_paused_past_its_ttl_is_told_and_refused(cluster, client: raftlock.Client) -> None:
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(raftlock.__file__).parents[1]))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, ",".join(cluster.endpoints)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        token = int(holder.stdout.readline().split()[1])
        holder.send_signal(signal.SIGSTOP)
        with client.session(ttl=10) as other:
            later = other.lock("paused", wait=15)  # granted once the paused holder's lease expired
            assert later.token > token
            holder.send_signal(signal.SIGCONT)
            holder.stdin.write("\n")
            holder.stdin.flush()
            lost = holder.stdout.readline().split(maxsplit=2)
            assert lost[:2] == ["lost", "True"], lost
            assert holder.stdout.readline().split() == ["released", "False"]
            assert client.validate(later.key, later.token).current
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()


def test_kv_txn_and_watch(client: raftlock.Client) -> None:
    client.put("cfg/a", "1")
    client.put("cfg/b", "2")
    assert [kv.key for kv in client.range("cfg/", prefix=True).kvs] == [b"cfg/a", b"cfg/b"]
    start = client.range("cfg/a").header.revision + 1
    watch = client.watch("cfg/", prefix=True, start_revision=start)
    events = []
    reader = threading.Thread(target=lambda: [events.append(e) for e, _ in zip(watch, range(2))])
    reader.start()
    client.put("cfg/c", "3")
    assert client.delete("cfg/a") == 1
    reader.join(10)
    watch.close()
    assert [(e.type, e.kv.key) for e in events] == [(0, b"cfg/c"), (1, b"cfg/a")]
    r = client.txn([txn.value("cfg/b", "==", "2")], success=[txn.put("cfg/b", "3")], failure=[txn.get("cfg/b")])
    assert r.succeeded and client.get("cfg/b").value == b"3"
    assert client.get("cfg/missing") is None
    lease = client.lease_grant(30)
    assert 0 < client.lease_ttl(lease) <= 30
    assert client.lease_keep_alive_once(lease) == 30
    client.lease_revoke(lease)
    with pytest.raises(raftlock.RaftlockError) as e:
        client.lease_revoke(lease)
    assert e.value.message == "etcdserver: requested lease not found"
    # A compacted revision is an error, not silence.
    client.compact(client.range("cfg/b").header.revision)
    with pytest.raises(raftlock.RaftlockError) as e:
        next(iter(client.watch("cfg/", prefix=True, start_revision=2)))
    assert e.value.code.name == "OUT_OF_RANGE"


def test_errors_carry_etcds_codes_and_messages(client: raftlock.Client) -> None:
    with pytest.raises(raftlock.RaftlockError) as e:
        client.put("", "x")
    assert e.value.message == "etcdserver: key is not provided"
    assert e.value.code.name == "INVALID_ARGUMENT"
    dead = raftlock.Client(["127.0.0.1:1"], timeout=1.0)
    with pytest.raises(raftlock.Unavailable):
        dead.get("x")


def test_generated_modules_are_current() -> None:
    script = pathlib.Path(__file__).resolve().parents[1] / "generate.py"
    out = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_elections_hand_over_in_campaign_order(client: raftlock.Client) -> None:
    a, b = client.session(ttl=10), client.session(ttl=10)
    lead = a.campaign("chief", "a")
    assert client.leader("chief").value == b"a"
    leaders = client.observe_leader("chief")
    assert next(leaders).value == b"a"
    lead.proclaim("a2")
    assert next(leaders).value == b"a2"
    got = {}
    candidate = threading.Thread(target=lambda: got.setdefault("b", b.campaign("chief", "b", wait=10)))
    candidate.start()
    deadline = time.monotonic() + 5
    while len(client.range("chief/", prefix=True).kvs) < 2:
        assert time.monotonic() < deadline, "b never campaigned"
        time.sleep(0.05)
    lead.resign()
    candidate.join(10)
    assert got["b"].token > lead.token
    assert next(leaders).value == b"b"
    assert not lead.lost.is_set(), "a resignation is not a loss"
    b.close()
    assert client.leader("chief") is None
    a.close()


def test_observe_tells_a_locks_events(client: raftlock.Client) -> None:
    with client.session(ttl=10) as session:
        events = client.observe("watched")
        assert list(next(events).events) == []
        lock = session.lock("watched", wait=0)
        granted = next(events).events[0]
        assert (granted.kind, granted.owner.token) == (raftlock.LockEvent.GRANTED, lock.token)
        assert lock.release()
        released = next(events).events[0]
        assert (released.kind, released.was_holding) == (raftlock.LockEvent.RELEASED, True)


def test_python_raftlockctl_and_etcdctl_holders_exclude_each_other(cluster, client: raftlock.Client) -> None:
    import shutil

    ctl = str(pathlib.Path(cluster.binary).with_name("raftlockctl"))
    etcdctl = shutil.which("etcdctl")
    assert etcdctl, "etcdctl is missing: scripts/test.sh installs it (Debian's etcd-client)"
    endpoints = ",".join(cluster.endpoints)
    with client.session(ttl=10) as session:
        lock = session.lock("shared-name", wait=0)
        tried = subprocess.run([ctl, "--endpoints", endpoints, "lock", "shared-name", "--try", "--", "true"],
                               capture_output=True, text=True, timeout=30)
        assert tried.returncode != 0, tried.stdout + tried.stderr
        waiter = subprocess.Popen([etcdctl, f"--endpoints={endpoints}", "lock", "shared-name", "echo", "etcdctl-held"],
                                  stdout=subprocess.PIPE, text=True, env=dict(os.environ, ETCDCTL_API="3"))
        deadline = time.monotonic() + 10
        while not client.describe("shared-name").waiters:
            assert time.monotonic() < deadline, "etcdctl never queued"
            time.sleep(0.05)
        assert waiter.poll() is None, "etcdctl ran its command while Python held the lock"
        assert lock.release()
        assert "etcdctl-held" in waiter.communicate(timeout=15)[0]
    holder = subprocess.Popen([ctl, "--endpoints", endpoints, "lock", "shared-name", "--", "sleep", "2"])
    try:
        deadline = time.monotonic() + 10
        while not client.describe("shared-name").holders:
            assert time.monotonic() < deadline, "raftlockctl never took the lock"
            time.sleep(0.05)
        held_by_ctl = client.describe("shared-name").holders[0].token
        with client.session(ttl=10) as session:
            with pytest.raises(raftlock.LockBusy):
                session.lock("shared-name", wait=0)
            after = session.lock("shared-name", wait=15)
            assert after.token > held_by_ctl
            assert holder.wait(10) == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_released_by_its_holder_is_never_told_lost(client: raftlock.Client) -> None:
    # The release's own deletion reaches the lock's events about when its
    # answer does; it must not read as someone else's (94 of 300 did once).
    with client.session(ttl=10) as session:
        told = 0
        for _ in range(100):
            lock = session.lock("own-release", wait=0)
            time.sleep(0.005)  # its events are followed by now
            assert lock.release()
            time.sleep(0.01)
            told += lock.lost.is_set()
        assert told == 0, f"{told} of 100 releases were told as losses"


def test_multi_locks_are_all_or_none_and_deadlock_free(client: raftlock.Client) -> None:
    with client.session(ttl=10) as a, client.session(ttl=10) as b:
        held = a.lock_all(["m/a", "m/b", raftlock.LockSpec("m/c", mode=raftlock.READ)], wait=0)
        assert [g.name for g in held.grants] == [b"m/a", b"m/b", b"m/c"]
        assert len({g.token for g in held.grants}) == 1, "one txn queues every place"
        with pytest.raises(raftlock.LockBusy) as busy:
            b.lock_all(["m/d", "m/b"], wait=0)  # overlapping, in another order
        assert busy.value.name == b"m/b"
        assert [h.token for h in busy.value.holders] == [held.grants[1].token]
        assert not client.describe("m/d").holders, "a refused multi-lock left a place behind"

        # Overlapping sets in different orders, from many threads: all granted in turn.
        errors: list = []

        def take(order: list) -> None:
            try:
                with client.session(ttl=10) as s:
                    with s.lock_all(order, wait=20):
                        time.sleep(0.01)
            except Exception as e:  # judged below
                errors.append(e)

        orders = [["x/1", "x/2", "x/3"], ["x/3", "x/1"], ["x/2", "x/3"], ["x/3", "x/2", "x/1"]] * 3
        threads = [threading.Thread(target=take, args=(o,)) for o in orders]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads), errors

        # The set is lost as one when its lease ends, and then released no more.
        client.lease_revoke(a.lease)
        assert held.lost.wait(5), "a multi-lock of a revoked lease was not told lost"
        assert not held.release()


def test_acquires_of_one_grant_share_it(client: raftlock.Client) -> None:
    with client.session(ttl=10) as session:
        first = session.lock("shared", wait=0)
        again = session.lock("shared", wait=0, reentrant=True)
        assert again is first and first.holds == 2
        assert again.release() and first.holds == 1
        assert first.release() and first.holds == 0
        assert not first.lost.wait(0.3), first.lost_reason
        # A plain acquire again is the same grant, with its one hold.
        lock = session.lock("shared", wait=0)
        assert session.lock("shared", wait=0) is lock and lock.holds == 1
        assert lock.release()
        assert not lock.release(), "the one hold was given back twice"
        assert not lock.lost.wait(0.3), lock.lost_reason


def test_a_session_survives_a_member_that_hangs(cluster) -> None:
    client = raftlock.Client(cluster.endpoints, timeout=2.0)
    session = client.session(ttl=3)
    lock = session.lock("hung", wait=0)
    cluster.processes[0].send_signal(signal.SIGSTOP)  # the member the client talks to
    try:
        began = time.monotonic()
        assert [h.token for h in client.describe("hung").holders] == [lock.token]
        assert time.monotonic() - began < 5, "a read took too long to leave a member that hangs"
        time.sleep(8)  # more than two TTLs: the lease lives only if renewed elsewhere
        assert not session.lost.is_set(), session.lost_reason
        assert not lock.lost.is_set(), lock.lost_reason
        client.lease_revoke(session.lease)
        assert lock.lost.wait(25), "a grant followed on a member that hangs was not told lost"
    finally:
        cluster.processes[0].send_signal(signal.SIGCONT)
        client.close()


def test_describe_asks_for_every_page_of_a_long_queue(client: raftlock.Client) -> None:
    # 1,205 keys under one name (the server answers 1,000 waiters a page):
    # the first holds, the others wait, in the order they were created.
    for start in range(0, 1205, 100):
        client.txn([], success=[txn.put(f"long/{i:05x}", "w") for i in range(start, start + 100)][: 1205 - start])
    d = client.describe("long")
    assert [h.key for h in d.holders] == [b"long/00000"]
    assert [w.key for w in d.waiters] == [f"long/{i:05x}".encode() for i in range(1, 1205)]
    assert not d.more


def test_list_asks_for_every_page_of_many_locks(client: raftlock.Client) -> None:
    # 1,205 locks (the server answers 1,000 a page), one lease owning a key
    # in each.
    lease = client.lease_grant(60)
    for start in range(0, 1205, 100):
        owners = [txn.put(f"many/{i:05}/{lease:x}", "w", lease=lease) for i in range(start, min(start + 100, 1205))]
        client.txn([], success=owners)
    locks = client.list_locks("many/")
    assert [lock.name for lock in locks] == [f"many/{i:05}".encode() for i in range(1205)]
    assert all(len(lock.holders) == 1 and lock.waiters == 0 for lock in locks)
