"""A write that reported trouble (slow: not acknowledged after SLOW_WRITE_S) and then ended
without going through (its partitions moved, its producer fenced, the worker stopping) leaves
no trouble behind: /ready names a stage only while one of its writes still waits.

Found by the scale-out chaos run in CI: a worker frozen (SIGSTOP) past its session timeout
resumed with an emit transaction slowed by the freeze, which then failed because the group
had moved on (PartitionsMoved). The worker carried on, but the slow write's trouble stayed,
and `/ready` answered 503 for good ("['w2'] not ready after 180 s").
"""

from __future__ import annotations

import asyncio

import pytest

from streams import progress as progress_module
from streams.engine.librdkafka import transactions as rd_transactions
from streams.progress import Progress, Stopping

SLOW_S = 0.05


@pytest.fixture(autouse=True)
def quick_slow_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "SLOW_WRITE_S", SLOW_S)


def test_a_slow_librdkafka_transaction_that_moved_leaves_no_trouble(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    progress = Progress()
    txns = rd_transactions.MemberTransactions("127.0.0.1:1", "app", "w0", lambda: None, progress)
    seen_in_trouble: list[bool] = []

    async def slow_then_moved(requests: object) -> None:
        await asyncio.sleep(SLOW_S * 4)  # reported slow meanwhile
        seen_in_trouble.append(progress.in_trouble("emit"))
        raise rd_transactions._Moved("UNKNOWN_MEMBER_ID: the group moved on")

    monkeypatch.setattr(txns, "_once", slow_then_moved)

    async def scenario() -> None:
        with pytest.raises(rd_transactions.PartitionsMoved):
            await txns.commit(0, [], {})

    asyncio.run(asyncio.wait_for(scenario(), 5))
    assert seen_in_trouble == [True]  # the slow write was reported ...
    assert not progress.in_trouble("emit")  # ... and its trouble ended with it
    assert progress.stuck() == {}


def test_a_librdkafka_transaction_given_up_on_stopping_leaves_no_trouble(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    progress = Progress()
    txns = rd_transactions.MemberTransactions("127.0.0.1:1", "app", "w0", lambda: None, progress)

    async def slow_then_stopping(requests: object) -> None:
        await asyncio.sleep(SLOW_S * 4)
        progress.stop()
        raise Stopping("the worker is stopping")

    monkeypatch.setattr(txns, "_once", slow_then_stopping)

    async def scenario() -> None:
        with pytest.raises(Stopping):
            await txns.commit(0, [], {})

    asyncio.run(asyncio.wait_for(scenario(), 5))
    assert not progress.in_trouble("emit")


def test_a_write_that_recovered_is_not_given_up_again(caplog: pytest.LogCaptureFixture) -> None:
    """`given_up` after `recovered` is nothing: one line, the recovery."""
    progress = Progress()
    progress.trouble("emit", "slow", "a transaction: not acknowledged", who=1)
    caplog.clear()
    with caplog.at_level("INFO", "streams.progress"):
        progress.recovered("emit", who=1)
        progress.given_up("emit", who=1)
    assert [record.getMessage().split(" after ")[0] for record in caplog.records] == [
        "emit stage makes progress again"
    ]


def test_a_slow_send_that_is_cancelled_leaves_no_trouble(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sender (a stage's records, a sweep's tombstones): a revoke cancels a
    `send_all` whose write was reported slow; the stage is not left named on /ready."""
    from streams.core.records import OutRecord
    from streams.engine.librdkafka.producer import RdRecordSender
    from streams.engine.outcomes import DeadLetters

    progress = Progress()

    async def scenario() -> None:
        sender = RdRecordSender("127.0.0.1:1", "test", progress, DeadLetters("dead", "normalize"))
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def slow(records: object, stage: str, replace: object, who: object) -> None:
            await progress.watch(stage, "1 records", never, who)

        monkeypatch.setattr(sender, "_send", slow)
        task = asyncio.ensure_future(sender.send_all([OutRecord("t", None, b"v")], "normalize"))
        while not progress.in_trouble("normalize"):
            await asyncio.sleep(SLOW_S / 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(scenario(), 5))
    assert not progress.in_trouble("normalize")
