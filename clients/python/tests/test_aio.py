"""raftlock.aio against a real 3-member cluster: the same locks, fencing,
lost events, elections and watches as the synchronous client, on asyncio."""

from __future__ import annotations

import asyncio

import pytest

import raftlock
import raftlock.aio


def test_asyncio_locks_fencing_and_lost_events(cluster) -> None:
    async def main() -> None:
        async with raftlock.aio.Client(cluster.endpoints) as client:
            async with client.session(ttl=10) as a:
                b = await client.session(ttl=10)
                async with a.lock("aio", wait=0, metadata="a") as first:
                    with pytest.raises(raftlock.LockBusy) as busy:
                        await b.lock("aio", wait=0)
                    assert busy.value.holders[0].token == first.token

                    async def take() -> raftlock.aio.Lock:
                        return await b.lock("aio", wait=10)

                    waiting = asyncio.get_running_loop().create_task(take())
                    while not (await client.describe("aio")).waiters:
                        await asyncio.sleep(0.05)
                # Leaving the block released the first grant: the waiter holds.
                later = await asyncio.wait_for(waiting, 10)
                assert later.token > first.token
                assert not await first.release(), "a stale release is refused"
                assert await later.validate()
                # Its lease revoked by someone else: told, and fenced out.
                await client.lease_revoke(b.lease)
                await asyncio.wait_for(later.lost.wait(), 5)
                assert later.lost_reason == "its lease ended (expired or revoked)"
                assert not await later.release()
                await asyncio.wait_for(b.lost.wait(), 10)
                with pytest.raises(raftlock.SessionLost):
                    await b.lock("aio", wait=0)

                lead = await a.campaign("aio-chief", "a")
                assert (await client.leader("aio-chief")).value == b"a"
                await lead.proclaim("a2")
                assert (await client.leader("aio-chief")).value == b"a2"
                await lead.resign()
                assert await client.leader("aio-chief") is None

                start = (await client.put("aio-w/x", "1")).header.revision + 1
                events = client.watch("aio-w/", prefix=True, start_revision=start)
                await client.put("aio-w/y", "2")
                event = await asyncio.wait_for(events.__anext__(), 10)
                assert (event.type, event.kv.key, event.kv.value) == (0, b"aio-w/y", b"2")
                await events.aclose()

    asyncio.run(main())


def test_asyncio_a_lock_released_by_its_holder_is_never_told_lost(cluster) -> None:
    async def main() -> None:
        async with raftlock.aio.Client(cluster.endpoints) as client:
            async with client.session(ttl=10) as session:
                told = 0
                for _ in range(100):
                    lock = await session.lock("own-release", wait=0)
                    await asyncio.sleep(0.005)
                    assert await lock.release()
                    await asyncio.sleep(0.01)
                    told += lock.lost.is_set()
                assert told == 0, f"{told} of 100 releases were told as losses"

    asyncio.run(main())


def test_asyncio_multi_locks(cluster) -> None:
    async def main() -> None:
        async with raftlock.aio.Client(cluster.endpoints) as client:
            async with client.session(ttl=10) as a, client.session(ttl=10) as b:
                async with a.lock_all(["aio-m/a", "aio-m/b"], wait=0) as held:
                    assert [g.name for g in held.grants] == [b"aio-m/a", b"aio-m/b"]
                    with pytest.raises(raftlock.LockBusy) as busy:
                        await b.lock_all(["aio-m/b", "aio-m/c"], wait=0.2)
                    assert busy.value.name == b"aio-m/b"
                later = await b.lock_all(["aio-m/b", "aio-m/c"], wait=0)
                assert later.grants[0].token > held.grants[1].token
                assert not held.lost.is_set(), "the holder's own release read as lost"
                await client.lease_revoke(b.lease)
                await asyncio.wait_for(later.lost.wait(), 5)
                assert not await later.release()

    asyncio.run(main())
