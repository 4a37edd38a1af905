"""A real 3-member raftlock cluster for the client's tests: processes of
the `raftlock` binary named by $RAFTLOCK_BIN (default: the repository's
target/debug/raftlock), on free ports of 127.0.0.1, each test its own."""

from __future__ import annotations

import fcntl
import os
import pathlib
import signal
import socket
import subprocess
import time
from typing import List, Sequence

import pytest

import raftlock

ROOT = pathlib.Path(__file__).resolve().parents[3]


PORT_CLAIMS = pathlib.Path("/tmp/raftlock-test-ports")
_claims: List[object] = []
_next_port = 0


def free_port() -> int:
    """A port for a member to listen on, chosen as the repository's Rust
    harness (``testkit::free_port``) chooses. Not the OS's "any free port":
    it can hand out one port twice before a member binds it, and it lies in
    the ephemeral range, where an outgoing connection (a member's to its
    peers) can take it meanwhile. Each test process walks its own sequence
    of 20000-31999, below the ephemeral range, skipping busy ports, and
    claims each port it hands out machine-wide for its life: an exclusive
    flock on ``/tmp/raftlock-test-ports/<port>``, dropped by the kernel when
    the process ends, so test processes running at once never share one."""
    global _next_port
    first, span = 20000, 12000
    start = (os.getpid() * 7919) % span
    for _ in range(span):
        port = first + (start + _next_port) % span
        _next_port += 1
        if not _claim(port):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port in 20000-31999")


def _claim(port: int) -> bool:
    try:
        PORT_CLAIMS.mkdir(exist_ok=True)
        f = open(PORT_CLAIMS / str(port), "a")
    except OSError:
        return True  # nowhere to claim: the sequence alone
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return False
    _claims.append(f)
    return True


class Cluster:
    """``member_flags`` (TLS flags, say) go to every member; ``scheme`` is
    its URLs'; ``client_options`` how a client connects (``tls=``)."""

    def __init__(
        self, tmp: pathlib.Path, size: int = 3, member_flags: Sequence[str] = (), scheme: str = "http", **client_options
    ) -> None:
        self.binary = binary = os.environ.get("RAFTLOCK_BIN", str(ROOT / "target" / "debug" / "raftlock"))
        if not os.path.exists(binary):
            raise RuntimeError(f"{binary} is missing: build raftlock first (cargo build), or set RAFTLOCK_BIN")
        self.client_ports = [free_port() for _ in range(size)]
        peer_ports = [free_port() for _ in range(size)]
        initial = ",".join(f"m{i}={scheme}://127.0.0.1:{p}" for i, p in enumerate(peer_ports))
        self.processes: List[subprocess.Popen] = []
        for i in range(size):
            url, peer = f"{scheme}://127.0.0.1:{self.client_ports[i]}", f"{scheme}://127.0.0.1:{peer_ports[i]}"
            args = [binary, "--name", f"m{i}", "--data-dir", str(tmp / f"m{i}"),
                    "--listen-client-urls", url, "--advertise-client-urls", url,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", initial, "--initial-cluster-state", "new", *member_flags]
            log = open(tmp / f"m{i}.log", "wb")
            self.processes.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
        self.endpoints = [f"127.0.0.1:{p}" for p in self.client_ports]
        client = raftlock.Client(self.endpoints, timeout=2.0, **client_options)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.put("conftest/ready", "1")
                break
            except raftlock.RaftlockError as e:
                if time.monotonic() > deadline:
                    logs = "".join(
                        f"--- m{i}'s log (end):\n{(tmp / f'm{i}.log').read_text(errors='replace')[-4000:]}\n"
                        for i in range(size)
                    )
                    raise RuntimeError(f"the cluster never served: {e}\n{logs}") from e
                time.sleep(0.2)
        client.close()

    def kill(self, i: int) -> None:
        self.processes[i].send_signal(signal.SIGKILL)
        self.processes[i].wait()

    def stop(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def cluster(tmp_path: pathlib.Path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


@pytest.fixture
def client(cluster: Cluster):
    with raftlock.Client(cluster.endpoints) as c:
        yield c
