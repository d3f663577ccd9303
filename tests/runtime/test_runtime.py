"""The private runtime: what it opens, and that it leaves nothing open when it cannot start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from factories import config_for

from fermix.api import Memory
from fermix.config import Config
from fermix.errors import InvalidInputError
from fermix.home import Home
from fermix.model import ConversationKey
from fermix.runtime import composition
from fermix.runtime.engine import Runtime


def open_descriptors(path: Path) -> int:
    """How many descriptors of this process point at ``path`` or its WAL and shm files."""
    names = {str(path), f"{path}-wal", f"{path}-shm"}
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in names:
                count += 1
        except OSError:
            continue  # closed between listing and reading
    return count


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count descriptors")
def test_h1_a_tree_that_fails_to_start_leaves_the_database_closed(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Refused(RuntimeError):
        pass

    def refuse(self: object) -> object:
        raise Refused("the tree did not start")

    runtime = Runtime(Home(home), Config())
    monkeypatch.setattr(composition.Supervisor, "start", refuse)
    with pytest.raises(Refused):
        runtime.start()
    assert open_descriptors(home / "memory.db") == 0
    monkeypatch.undo()
    with Memory(home, config=Config()) as memory:  # the home is usable right after
        assert memory.conversation("a", "c", "1").append_user("still here").id == 1


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("conversation_cap", 0),
        ("conversation_cap", True),
        ("conversation_cap", 2.5),
        ("idle_s", 0),
        ("idle_s", -1.0),
        ("idle_s", "600"),
    ],
)
def test_h3_bad_runtime_bounds_are_typed_errors_before_anything_opens(
    home: Path, keyword: str, value: object
) -> None:
    with pytest.raises(InvalidInputError, match=keyword):
        Memory(home, config=Config(), **{keyword: value})  # type: ignore[arg-type]
    assert not (home / "memory.db").exists()


def test_a7_a_started_runtime_closes_everything_it_opened(home: Path) -> None:
    runtime = Runtime(Home(home), config_for("http://127.0.0.1:9"))
    runtime.start()
    assert runtime.history(ConversationKey("a", "c", "1")) == []
    runtime.close()
    assert open_descriptors(home / "memory.db") == 0
    assert not runtime.running
