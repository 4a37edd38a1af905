"""python-etcd3's locks against an etcd v3 endpoint (raftlock in the tests).

Usage: etcd3_locks.py HOST PORT. Exits 0 and prints "ok" when every check
holds; an assertion error otherwise.
"""
import sys
import threading
import time

import etcd3

host, port = sys.argv[1], int(sys.argv[2])


def client():
    return etcd3.client(host=host, port=port, timeout=10)


# Mutual exclusion: a read-modify-write under the lock loses no update.
THREADS, ROUNDS = 4, 5
errors = []


def worker():
    c = client()
    try:
        for _ in range(ROUNDS):
            with c.lock("py-counter", ttl=10):
                value, _ = c.get("py/counter")
                n = int(value) if value else 0
                time.sleep(0.01)
                c.put("py/counter", str(n + 1))
    except Exception as e:  # reported below; a thread's exception is otherwise lost
        errors.append(e)


threads = [threading.Thread(target=worker) for _ in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
c = client()
assert c.get("py/counter")[0] == str(THREADS * ROUNDS).encode(), c.get("py/counter")

# A held lock: a second acquirer times out, then gets it once it is released.
a = c.lock("py-held", ttl=10)
assert a.acquire(timeout=2) and a.is_acquired()
b = client().lock("py-held", ttl=10)
started = time.time()
assert not b.acquire(timeout=0.5)
assert time.time() - started >= 0.5
a.release()
assert b.acquire(timeout=2)
b.release()

# A holder that stops refreshing loses the lock when its lease expires.
dead = c.lock("py-expiring", ttl=2)
assert dead.acquire(timeout=2)
started = time.time()
heir = client().lock("py-expiring", ttl=10)
assert heir.acquire(timeout=10)
waited = time.time() - started
assert 1.0 <= waited <= 6.0, waited
assert not dead.is_acquired()
heir.release()
print("ok")
