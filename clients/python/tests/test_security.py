"""mTLS and etcd auth from the Python client: certificates made by openssl
in the test, members under mTLS on both ports, auth turned on with
etcdctl as an operator would."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import grpc
import pytest

import raftlock
from conftest import Cluster


def make_certs(dir: pathlib.Path) -> dict:
    """A CA, a member certificate for 127.0.0.1 (server and client use) and
    a client certificate with CN "alice", as PEM files."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl is missing"

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=dir)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
        "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=raftlock Python client test CA")
    for name, ext in [("member", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"),
                      ("alice", "extendedKeyUsage=clientAuth\n")]:
        (dir / f"{name}.ext").write_text(ext)
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "1", "-out", f"{name}.pem", "-extfile", f"{name}.ext")
    return {name: str(dir / name) for name in ["ca.pem", "member.pem", "member.key", "alice.pem", "alice.key"]}


def test_mutual_tls_and_etcd_auth(tmp_path: pathlib.Path) -> None:
    certs = make_certs(tmp_path)
    member = ["--cert-file", certs["member.pem"], "--key-file", certs["member.key"],
              "--trusted-ca-file", certs["ca.pem"], "--client-cert-auth", "true",
              "--peer-cert-file", certs["member.pem"], "--peer-key-file", certs["member.key"],
              "--peer-trusted-ca-file", certs["ca.pem"], "--peer-client-cert-auth", "true"]
    alice = raftlock.TLS(ca=certs["ca.pem"], cert=certs["alice.pem"], key=certs["alice.key"])
    cluster = Cluster(tmp_path, member_flags=member, scheme="https", tls=alice)
    try:
        # With its certificate, a client locks as anywhere.
        with raftlock.Client(cluster.endpoints, tls=alice) as client:
            with client.session(ttl=10) as session:
                lock = session.lock("tls", wait=0)
                assert lock.validate()
            # Without one, the members refuse the connection.
            with raftlock.Client(cluster.endpoints, tls=raftlock.TLS(ca=certs["ca.pem"]), timeout=2.0) as anonymous:
                with pytest.raises(raftlock.Unavailable):
                    anonymous.describe("tls")

            # Auth on, as an operator turns it on.
            def etcdctl(*args: str) -> None:
                endpoints = ",".join(f"https://{e}" for e in cluster.endpoints)
                subprocess.run([shutil.which("etcdctl") or "etcdctl", f"--endpoints={endpoints}", f"--cacert={certs['ca.pem']}",
                                f"--cert={certs['alice.pem']}", f"--key={certs['alice.key']}", *args],
                               check=True, capture_output=True, env=dict(os.environ, ETCDCTL_API="3"))

            etcdctl("user", "add", "root", "--new-user-password=root-secret")
            etcdctl("auth", "enable")
            # The user and password give a token; the lock API answers to it.
            with raftlock.Client(cluster.endpoints, tls=alice, user="root", password="root-secret") as root:
                with root.session(ttl=10) as session:
                    held = session.lock("tls-auth", wait=0)
                    assert [h.token for h in root.describe("tls-auth").holders] == [held.token]
            # A wrong password is refused with etcd's error.
            with pytest.raises(raftlock.RaftlockError) as wrong:
                raftlock.Client(cluster.endpoints, tls=alice, user="root", password="wrong")
            assert wrong.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert wrong.value.message == "etcdserver: authentication failed, invalid user ID or password"
            # Without a token, the certificate's CN is the user (as in etcd):
            # there is no user "alice", so she may not take a lease.
            with pytest.raises(raftlock.RaftlockError) as nobody:
                client.session(ttl=10)
            assert (nobody.value.code, nobody.value.message) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                                 "etcdserver: user name not found")
    finally:
        cluster.stop()
