"""The Python client's runner of the steps every raftlock client runs
(clients/conformance/locks.json), each case against a real cluster."""

from __future__ import annotations

import json
import pathlib
import threading
import time
import uuid
from typing import Any, Dict

import pytest

import raftlock

STEPS = pathlib.Path(__file__).resolve().parents[2] / "conformance" / "locks.json"
CASES = json.loads(STEPS.read_text())["cases"]


class Background:
    """An acquire or campaign that waits, run on a thread."""

    def __init__(self, work) -> None:
        self.result: Any = None
        self.error: Any = None

        def run() -> None:
            try:
                self.result = work()
            except Exception as e:  # the step that awaits it judges it
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait(self) -> Any:
        self.thread.join(15)
        assert not self.thread.is_alive(), "it never answered"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_conformance(client: raftlock.Client, case: Dict[str, Any]) -> None:
    prefix = f"conformance-{uuid.uuid4().hex[:8]}/"
    sessions: Dict[str, raftlock.Session] = {}
    grants: Dict[str, Any] = {}
    try:
        for i, step in enumerate(case["steps"]):
            where = f"step {i} {step}"
            op = step["op"]
            if op == "session":
                sessions[step["as"]] = client.session(ttl=step["ttl"])
            elif op in ("acquire", "campaign"):
                session = sessions[step["session"]]
                if op == "acquire":
                    wait_ms = step.get("wait_ms", -1)
                    work = lambda s=session, st=step, w=wait_ms: s.lock(  # noqa: E731
                        prefix + st["lock"], wait=None if w < 0 else w / 1000, permits=st.get("permits", 1),
                        mode=st.get("mode", "write"), reentrant=st.get("reentrant", False))
                else:
                    work = lambda s=session, st=step: s.campaign(prefix + st["election"], st["value"])  # noqa: E731
                if step.get("background"):
                    grants[step["as"]] = Background(work)
                    continue
                if step.get("expect", "held") == "busy":
                    with pytest.raises(raftlock.LockBusy) as busy:
                        work()
                    assert [h.token for h in busy.value.holders] == [grants[g].token for g in step["holders"]], where
                    continue
                grants[step["as"]] = work()
                check_grant(grants, step, where)
            elif op == "await":
                grants[step["grant"]] = grants[step["grant"]].wait()
                check_grant(grants, {**step, "as": step["grant"]}, where)
            elif op == "release":
                g = grants[step["grant"]]
                released = client.call(lambda s: s.locks.Release, raftlock_release(g))
                assert released.released == step["expect"], where
                if "holds" in step:
                    assert released.holds == step["holds"], where
            elif op == "validate":
                g = grants[step["grant"]]
                assert client.validate(g.key, g.token, permits=g.permits).current == step["expect"], where
            elif op == "describe":
                # Background steps queue in their own time: look until it matches, 5 s at most.
                want = ([grants[g].token for g in step["holders"]], step["waiters"])
                deadline = time.monotonic() + 5
                while True:
                    d = client.describe(prefix + step["lock"], permits=step.get("permits", 1))
                    seen = ([h.token for h in d.holders], len(d.waiters))
                    if seen == want or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                assert seen == want, where
            elif op == "revoke":
                client.lease_revoke(sessions[step["session"]].lease)
            elif op == "lost":
                g = grants[step["grant"]]
                assert g.lost.wait(step["within_ms"] / 1000), where
                cause = {"lease_ended": "its lease ended", "released": "its key was deleted"}[step["cause"]]
                assert cause in (g.lost_reason or ""), (where, g.lost_reason)
            elif op == "leader":
                kv = client.leader(prefix + step["election"])
                assert (kv.value.decode() if kv is not None else None) == step["expect"], where
            elif op == "resign":
                grants[step["grant"]].resign()
            else:
                raise AssertionError(f"unknown op {op!r}")
    finally:
        for session in sessions.values():
            try:
                session.close()
            except raftlock.RaftlockError:
                pass


def raftlock_release(grant: Any) -> Any:
    from raftlock._proto.raftlock.v1 import lock_pb2

    return lock_pb2.ReleaseRequest(key=grant.key, token=grant.token)


def check_grant(grants: Dict[str, Any], step: Dict[str, Any], where: str) -> None:
    g = grants[step["as"]]
    if "token_above" in step:
        assert g.token > grants[step["token_above"]].token, where
    if "same_as" in step:
        other = grants[step["same_as"]]
        assert (g.key, g.token) == (other.key, other.token), where
    if "holds" in step:
        assert g.holds == step["holds"], where
