"""Chat commands: the parser, and /compact, /new, /clear as operator and as guest (K4)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from factories import StartMemory, config_for
from hypothesis import given
from hypothesis import strategies as st
from model_server import ModelServer

from fermix import Conversation, Memory
from fermix.config import CompactionConfig
from fermix.core import categories
from fermix.core.commands import NO_MODEL_REPLY, Command, allowed, help_text, parse, refusal
from fermix.model import Provenance
from fermix.storage import Writes
from fermix.storage.sqlite.migrations import open_database

# -- the parser -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/compact", Command("compact")),
        ("/new", Command("new")),
        ("/clear", Command("clear")),
        ("/COMPACT", Command("compact")),
        ("/New", Command("new")),
        ("/compact@my_bot", Command("compact")),
        ("/clear@Bot42 now", Command("clear", "now")),
        ("/compact please keep the dates", Command("compact", "please keep the dates")),
        ("/new   spaced  out  ", Command("new", "spaced  out")),
        ("   /new", Command("new")),
        ("\t/clear\n", Command("clear")),
        ("/compact\nsecond line", Command("compact", "second line")),
    ],
)
def test_k4_commands_are_recognised(text: str, expected: Command) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        "",
        "   ",
        "/unknown",
        "/compacting",
        "//x",
        "//compact",
        "/",
        "/ new",
        "a /new",
        "/compact@",
        "/compact@bot@bot",
        "/1new",
        "compact",
    ],
)
def test_k4_other_text_is_not_a_command_and_is_left_to_the_host(text: str) -> None:
    assert parse(text) is None


@given(st.text())
def test_k4_any_text_parses_to_a_known_command_or_none(text: str) -> None:
    command = parse(text)
    assert command is None or (command.name in {"compact", "new", "clear"})


def test_k4_every_command_is_operator_only_and_the_refusal_names_it() -> None:
    for name in ("compact", "new", "clear"):
        command = Command(name)
        assert allowed(command, "operator")
        assert not allowed(command, "guest")
        assert refusal(command) == f"Only the operator can use /{name}. Nothing was changed."


def test_k4_the_help_text_lists_every_fermix_command_then_the_hosts_in_aligned_columns() -> None:
    host = {"memory": "show the prompt files", "help": "show the commands"}
    lines = help_text(host).splitlines()
    names = [line.split()[0] for line in lines]
    assert names == ["/compact", "/new", "/clear", "/memory", "/help"]
    # every description starts in the same column, two spaces past the longest name
    starts = {
        len(line) - len(line[len(name) :].lstrip()) for line, name in zip(lines, names, strict=True)
    }
    assert starts == {len("/compact") + 2}
    assert lines[2].endswith("the same as /new")
    assert lines[3].endswith("show the prompt files")
    assert help_text().splitlines() == lines[:3]


# -- through the host facade --------------------------------------------------------------


@pytest.fixture
def running(start_memory: StartMemory, model_server: ModelServer) -> Memory:
    """A running Memory on the loopback model server with a 2,000-token context window, so
    30 turns are enough to compact, and summaries at reasoning effort "low"."""
    compaction = CompactionConfig(reasoning_effort="low")
    return start_memory(config_for(model_server, context_window=2_000, compaction=compaction))


DERIVED = "name NOT IN ('message_vectors', 'memory_vectors') AND name NOT LIKE 'embedding%'"
"""The tables the background embedder writes whenever it catches up (Q2): derived from the
rows, at moments no command controls, so they are no part of what a command changed."""


def dump(memory: Memory) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (FTS shadow tables included, the vectors not: DERIVED), and
    the schema version."""
    conn = open_database(memory.home.db_path)  # its own connection: sees every commit
    try:
        tables = [
            name
            for (name,) in conn.execute(
                f"SELECT name FROM sqlite_master WHERE type = 'table' AND {DERIVED} ORDER BY name"
            )
        ]
        found = {t: sorted(conn.execute(f'SELECT * FROM "{t}"'), key=repr) for t in tables}
        found["user_version"] = conn.execute("PRAGMA user_version").fetchall()
    finally:
        conn.close()
    return found


LONG_TERM = (
    "memories",
    "memories_fts",
    "memory_sources",
    "memory_changes",
    "resources",
    "resource_revisions",
    "scheduled_jobs",
    "job_runs",
)
SEEDED = ("memories", "memory_sources", "resources", "resource_revisions", "scheduled_jobs")


def seed_long_term_state(memory: Memory, conv: Conversation) -> None:
    """A memory row, USER.md with its revision, and a scheduled job (with a run)."""

    def write(writes: Writes) -> None:
        writes.upsert_row(
            agent_id="agent",
            owner_id="alice",
            scope=categories.owner_scope("alice"),
            category="identity",
            key="home_city",
            value="Alice lives in Porto",
            promote_target="user_md",
            provenance=Provenance(source_type="review"),
        )
        job = writes.create_job(
            agent_id="agent", name="digest", schedule="0 9 * * *", prompt="A digest."
        )
        writes.start_run(job.id)

    memory._runtime.services.storage.write(write, label="seed")
    # USER.md on disk, and its first revision, as the reviewer would leave them
    rebuilt = memory._runtime.services.files.rebuild("agent", "alice")
    assert rebuilt.user_md.revision is not None
    stored = json.loads(
        memory.tools.run(
            {"function": {"name": "memory_store", "arguments": {"key": "k", "value": "v"}}}, conv
        )
    )
    assert "stored" in stored


def fill(conv: Conversation, turns: int) -> None:
    for i in range(turns):
        conv.append_user(f"question {i} about the harbour in Porto and its boats")
        conv.append_assistant(f"answer {i}: the harbour in Porto is busy in May")


@pytest.mark.parametrize("text", ["/new", "/clear", "/NEW@bot", "  /clear now"])
def test_k4_new_and_clear_start_a_fresh_window_and_keep_everything_stored(
    running: Memory, model_server: ModelServer, text: str
) -> None:
    conv = running.conversation("agent", "telegram", "1", owner_id="alice", trust="operator")
    fill(conv, 5)
    seed_long_term_state(running, conv)
    before = dump(running)
    assert all(before[table] for table in SEEDED)
    newest = conv.history()[-1]

    reply = conv.handle_command(text)

    assert reply == "Started a fresh conversation window. Long-term memory is kept."
    assert conv.history() == []
    state = conv.state()
    assert state is not None
    assert (state.window_after_id, state.checkpoint_message_id) == (newest.id, None)
    after = dump(running)
    assert after["messages"] == before["messages"]  # the messages themselves stay
    for table in LONG_TERM:
        assert after[table] == before[table], table
    assert model_server.requests == []
    composed = json.dumps(conv.compose("You are helpful."))
    assert "harbour" not in composed  # the old window is out of the prompt...
    assert "Alice lives in Porto" in composed  # ...and the prompt files are still in it
    fresh = conv.append_user("a new start")
    assert conv.history() == [fresh]


def test_k4_new_after_a_compaction_drops_the_checkpoint_from_the_window(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "telegram", "1", owner_id="alice", trust="operator")
    fill(conv, 30)
    model_server.reply("A summary.")
    assert (conv.handle_command("/compact") or "").startswith("Compacted ")
    assert conv.handle_command("/new") is not None
    assert conv.history() == []
    assert conv.state().checkpoint_message_id is None  # type: ignore[union-attr]


def test_k4_compact_summarizes_the_window_now_and_keeps_long_term_state(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "telegram", "1", owner_id="alice", trust="operator")
    fill(conv, 30)
    seed_long_term_state(running, conv)
    before = dump(running)
    assert all(before[table] for table in SEEDED)
    window = conv.history()
    model_server.reply("The user asked about the harbour in Porto.")

    reply = conv.handle_command("/compact")

    assert reply is not None and reply.startswith("Compacted ")
    assert reply.endswith(" tokens).")
    new_window = conv.history()
    assert new_window[0].content == "The user asked about the harbour in Porto."
    assert new_window[1:] == window[-(len(new_window) - 1) :]
    (request,) = model_server.requests
    assert request["reasoning_effort"] == "low"
    after = dump(running)
    # one row more: the checkpoint; every earlier message unchanged
    assert set(before["messages"]) < set(after["messages"])
    assert len(after["messages"]) == len(before["messages"]) + 1
    for table in LONG_TERM:
        assert after[table] == before[table], table


def test_k4_compact_with_nothing_to_summarize_says_so_and_changes_nothing(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "telegram", "1", owner_id="alice", trust="operator")
    fill(conv, 2)
    before = dump(running)
    assert conv.handle_command("/compact") == "Nothing to compact yet."
    assert dump(running) == before
    assert model_server.requests == []


def test_k4_m8_compact_without_a_model_says_compaction_is_off_and_changes_nothing(
    memory: Memory,
) -> None:
    conv = memory.conversation("agent", "telegram", "1", owner_id="alice", trust="operator")
    fill(conv, 30)
    before = dump(memory)
    reply = conv.handle_command("/compact")
    assert reply == NO_MODEL_REPLY == "Compaction is off: no model is configured."
    assert dump(memory) == before


def test_k4_a_failed_compact_reports_the_error_and_keeps_the_window(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "telegram", "1", owner_id="alice", trust="operator")
    fill(conv, 30)
    window = conv.history()
    model_server.fail(400)
    reply = conv.handle_command("/compact")
    assert reply is not None and reply.startswith("Compaction failed: ")
    assert conv.history() == window


@pytest.mark.parametrize(
    ("text", "name"),
    [("/compact", "compact"), ("/new", "new"), ("/clear", "clear"), ("/CLEAR@bot x", "clear")],
)
def test_k4_a_guest_is_refused_and_nothing_in_the_database_changes(
    running: Memory, model_server: ModelServer, text: str, name: str
) -> None:
    operator = running.conversation("agent", "telegram", "1", owner_id="alice", trust="operator")
    seed_long_term_state(running, operator)
    guest = running.conversation("agent", "telegram", "2", owner_id="bob", trust="guest")
    fill(guest, 30)  # enough to compact, were it allowed
    window = guest.history()
    before = dump(running)

    reply = guest.handle_command(text)

    assert reply == f"Only the operator can use /{name}. Nothing was changed."
    assert dump(running) == before
    assert guest.history() == window
    assert model_server.requests == []


@pytest.mark.parametrize("text", ["hello there", "/unknown", "/help", "a /new"])
def test_k4_text_that_is_not_a_command_returns_none_and_changes_nothing(
    running: Memory, text: str
) -> None:
    conv = running.conversation("agent", "telegram", "1", owner_id="alice", trust="operator")
    fill(conv, 2)
    before = dump(running)
    assert conv.handle_command(text) is None
    assert dump(running) == before
