"""A forget killed at any point is finished later (F5), on SQLite.

A child process forgets alice and SIGKILLs itself right after its N-th committed erasure
unit (the record, each step of rows, the rows gone), at points that every run of it has (the
steps' sizes follow their times). Then ``fermix doctor`` reports the unfinished
erasure, and either the next start of a host or the same call again finishes it: nothing of
alice is left in the rows or in any file of the home, and bob keeps every message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from factories import other_process, reading

from fermix.api import Memory
from fermix.cli import main
from fermix.cli.doctor_checks.diagnosis import diagnose
from fermix.clock import now_ms
from fermix.home import Home
from fermix.model import ConversationKey, NewMessage
from fermix.storage import erasure

MARK = b"quixoticlanternzq"
ALICE_MESSAGES = 2 * erasure.BATCH + 40
"""Enough for several batches: the kill lands between them too."""

_FORGETTER = textwrap.dedent(
    """
    import os, signal, sys
    from fermix.api import Memory
    from fermix.runtime.writer import Writer

    stop_after = int(sys.argv[2])
    committed = 0

    def counting(write):
        def counted(self, unit, *, label):
            global committed
            result = write(self, unit, label=label)
            if label.startswith("erasure"):
                committed += 1
                if committed == stop_after:
                    os.kill(os.getpid(), signal.SIGKILL)
            return result
        return counted

    Writer.write = counting(Writer.write)
    Writer.write_aside = counting(Writer.write_aside)  # the erasure's steps
    with Memory(sys.argv[1]) as memory:
        memory.forget_owner("alice")
    print("finished", committed, flush=True)
    """
)


def _seed(home: Path) -> None:
    with other_process(home) as writer:
        for i in range(ALICE_MESSAGES):
            chat = "alice-dm" if i % 2 else "group"
            key = ConversationKey("bot", "tg", chat)
            text = f"alice {i} {MARK.decode()}"
            writer.append(NewMessage(key, "user", text, owner_id="alice"), trust="guest")
        for i in range(20):
            key = ConversationKey("bot", "tg", "group")
            writer.append(NewMessage(key, "user", f"bob {i}", owner_id="bob"), trust="guest")


def _files_hold_mark(home: Path) -> list[str]:
    found = []
    for root, _dirs, names in os.walk(home):
        for name in names:
            path = Path(root, name)
            if MARK in path.read_bytes():
                found.append(str(path.relative_to(home)))
    return found


@pytest.mark.parametrize("stop_after", [1, 2, 3, 5, 7], ids=lambda n: f"killed after unit {n}")
@pytest.mark.parametrize("finish_by", ["the next start", "the same call again"])
def test_f5_a_forget_killed_at_any_point_is_finished_later(
    home: Path, stop_after: int, finish_by: str
) -> None:
    _seed(home)
    child = subprocess.run(
        [sys.executable, "-c", _FORGETTER, str(home), str(stop_after)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    report = diagnose(Home(home), now=now_ms())
    (check,) = [c for c in report.checks if c.name == "erasures"]
    assert check.status == "fail" and check.fix == "erasures"

    if finish_by == "the same call again":
        # The command line: it builds the services without starting them, so nothing but
        # the call itself finishes the erasure.
        assert main(["--home", str(home), "owner", "forget", "alice", "--yes"]) == 0
    with Memory(home) as memory:
        (record,) = memory.erasures()
        assert record.state == "done" and record.subject is None
        assert record.counts["messages"] == ALICE_MESSAGES
    with reading(home) as reads:
        group = reads.messages(ConversationKey("bot", "tg", "group"))
        assert [m.content for m in group] == [f"bob {i}" for i in range(20)]
        assert reads.messages(ConversationKey("bot", "tg", "alice-dm")) == []
        assert reads.unfinished_erasures() == []
    assert _files_hold_mark(home) == []


def test_f5_a_kill_after_the_last_unit_leaves_nothing_to_finish(home: Path) -> None:
    _seed(home)
    child = subprocess.run(
        [sys.executable, "-c", _FORGETTER, str(home), "1000"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        check=False,
    )
    assert child.returncode == 0, child.stderr
    units = int(child.stdout.split()[-1])
    # the record, at least five steps (a step is at most BATCH rows: two chats' messages,
    # the chat itself, the last one finding nothing), the rows gone, done; the kills above
    # fall inside it whatever the steps' sizes
    assert units >= 8
    assert _files_hold_mark(home) == []
