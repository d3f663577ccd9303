"""The group-commit writer: batching, isolation of a failing unit, retries (A1, S8)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path

import apsw
import pytest
from faults import FaultVFS

from fermix.errors import WriteFailedError
from fermix.model import ConversationKey, NewMessage
from fermix.storage import messages, open_database
from fermix.storage.committer import Committer, RetryPolicy

KEY = ConversationKey("agent", "cli", "1")
_vfs = FaultVFS("fermix-faulty-committer")


def _insert(text: str):  # type: ignore[no-untyped-def]
    return lambda conn: messages.insert(conn, NewMessage(KEY, "user", text))


def test_a1_concurrent_units_share_commits_and_all_land(tmp_path: Path) -> None:
    committer = Committer(open_database(tmp_path / "m.db"))
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        start.wait(5)
        for i in range(50):
            committer.run(_insert(f"{n}-{i}"))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    conn = open_database(tmp_path / "m.db")
    assert messages.count(conn, KEY) == 400
    assert committer.batches <= 400
    committer.close()


def test_a1_a_failing_unit_is_left_out_and_its_batchmates_commit(tmp_path: Path) -> None:
    committer = Committer(open_database(tmp_path / "m.db"))

    def bad(conn: apsw.Connection) -> None:
        messages.insert(conn, NewMessage(KEY, "user", "half"))
        raise ValueError("this unit fails after writing")

    batch = [(work, Future(), "unit") for work in (_insert("a"), bad, _insert("b"))]
    committer._lead(batch)  # one batch, as concurrent callers would have queued it
    outcomes = [future.exception() for _, future, _ in batch]
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], ValueError)
    conn = open_database(tmp_path / "m.db")
    assert [m.content for m in messages.conversation(conn, KEY)] == ["a", "b"]
    committer.close()


def test_a1_transient_faults_are_retried_then_typed(tmp_path: Path) -> None:
    committer = Committer(
        open_database(tmp_path / "m.db", vfs=_vfs.vfs_name), retry=RetryPolicy(attempts=3)
    )
    _vfs.plan.fail("write", times=2, suffix="-wal")
    committer.run(_insert("after two faults"))
    _vfs.plan.fail("write", times=None, suffix="-wal")
    try:
        with pytest.raises(WriteFailedError, match="3 attempts"):
            committer.run(_insert("never"))
    finally:
        _vfs.plan.clear()
    conn = open_database(tmp_path / "m.db")
    assert [m.content for m in messages.conversation(conn, KEY)] == ["after two faults"]
    committer.close()
