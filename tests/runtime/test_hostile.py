"""Hostile inputs through every entry point (issue 8; A1, T1-T5, E4-E5, K4, C5, H3, S2).

The catalogue is data: ``tests/data/hostile_inputs.json``. Each input must give a clear
typed error or a safe result, and nothing outside the intended change may be modified.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from hostile_data import NUMBERS, TEXTS

from fermix import model
from fermix.api import Memory
from fermix.cli import main
from fermix.config import load_config
from fermix.core import categories, commands, review_admission, review_answer
from fermix.errors import ConfigError, FermixError, InvalidInputError, ReviewOutputError
from fermix.home import Home
from fermix.model import MemoryRow
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.prompt_files.disk import prompt_dir
from fermix.runtime.writer import Writer
from fermix.storage import Writes
from fermix.storage.sqlite.connection import fetch_rows
from fermix.storage.sqlite.database import Database
from fermix.storage.sqlite.migrations import open_database

pytestmark = pytest.mark.keep_actors


IDS = [f"text{i}" for i in range(len(TEXTS))]


def test_the_catalogue_holds_at_least_100_cases() -> None:
    assert len(TEXTS) + len(NUMBERS) >= 100


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Memory]:
    home = Home(tmp_path_factory.mktemp("hostile") / "home")
    _seed_prompt_files(home)
    with Memory(home) as running:
        bystander = running.conversation("agent", "cli", "bystander", owner_id="bob")
        bystander.append_user("bob's own message")
        running.tools.run(
            {
                "function": {
                    "name": "memory_store",
                    "arguments": json.dumps({"key": "bob", "value": "bob's fact"}),
                }
            },
            bystander,
        )
        yield running


def _seed_prompt_files(home: Home) -> None:
    """A profile row of bob's and the shared rules, rendered into prompt files as another
    process would: the snapshots then hold real files that must not change either."""
    db = Database(home.db_path)
    try:

        def unit(writes: Writes) -> list[MemoryRow]:
            return [
                writes.upsert_row(
                    agent_id="agent",
                    owner_id=owner,
                    scope=scope,
                    category=category,
                    key=key,
                    value=value,
                    promote_target=model.TARGET_OF[category],
                )
                for owner, scope, category, key, value in (
                    ("bob", categories.owner_scope("bob"), "identity", "job", "bob's job: pilot"),
                    ("", categories.agent_scope("agent"), "directive", "tone", "Answer briefly"),
                )
            ]

        written = Writer(db, PromptFiles(home, db)).write_rows(unit, label="seed")
        assert written.error is None and written.files_changed
    finally:
        db.close()


def _snapshot(memory: Memory, *, skip_chat: str | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, leaving out the rows of one chat that a test may change,
    and every file under the home's ``memory/`` folder (the prompt files)."""
    folder = memory.home.root / "memory"
    out: dict[str, list[tuple[Any, ...]]] = {
        "files": sorted(
            (str(path.relative_to(folder)), path.read_bytes() if path.is_file() else b"")
            for path in folder.rglob("*")
        )
    }
    conn = open_database(memory.home.db_path)
    try:
        for (table,) in fetch_rows(
            conn,
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '%fts%'"
            " AND name NOT IN ('memory_changes', 'sqlite_sequence')"
            # the vectors: derived, written by the background embedder at any moment (Q2)
            " AND name NOT IN ('message_vectors', 'memory_vectors')"
            " AND name NOT LIKE 'embedding%'",
        ):
            rows = fetch_rows(conn, f"SELECT * FROM {table}")
            if skip_chat is not None and table in ("messages", "conversations", "memories"):
                rows = [r for r in rows if skip_chat not in map(str, r)]
            out[table] = sorted(rows, key=repr)
        return out
    finally:
        conn.close()


def _chat(index: int) -> str:
    return f"hostile-{index}"


@pytest.mark.parametrize("index", range(len(TEXTS)), ids=IDS)
def test_h3_an_append_of_any_text_is_stored_exactly_or_refused(memory: Memory, index: int) -> None:
    text = TEXTS[index]
    conv = memory.conversation("agent", "cli", _chat(index), owner_id="alice")
    before = _snapshot(memory, skip_chat=_chat(index))
    try:
        stored = conv.append_user(text)
    except InvalidInputError:
        assert conv.history() == []
    else:
        assert stored.content == text
        assert [m.content for m in conv.history()] == [text]
    assert _snapshot(memory, skip_chat=_chat(index)) == before


@pytest.mark.parametrize("index", range(len(TEXTS)), ids=IDS)
def test_t1_memory_store_of_any_text_stores_it_in_this_conversation_or_refuses(
    memory: Memory, index: int
) -> None:
    text = TEXTS[index]
    conv = memory.conversation("agent", "cli", _chat(index), owner_id="alice")
    before = _snapshot(memory, skip_chat=conv.key.scope_id)
    arguments = json.dumps({"key": text[:150] or "k", "value": text})
    out = json.loads(
        memory.tools.run({"function": {"name": "memory_store", "arguments": arguments}}, conv)
    )
    if "error" not in out:
        row = memory.get_row(out["stored"]["id"])
        assert row is not None and row.value == text.strip()
        assert (row.scope_type, row.scope_id, row.promote_target) == (
            "conversation",
            conv.key.scope_id,
            None,
        )
    assert _snapshot(memory, skip_chat=conv.key.scope_id) == before


@pytest.mark.parametrize("index", range(len(TEXTS)), ids=IDS)
def test_t2_memory_recall_of_any_text_never_raises_nor_crosses_owners(
    memory: Memory, index: int
) -> None:
    conv = memory.conversation("agent", "cli", "reader", owner_id="alice")
    before = _snapshot(memory)
    arguments = {"query": TEXTS[index], "scope": "all", "source": "all"}
    for raw in (json.dumps(arguments), TEXTS[index]):  # as a query, and as the raw arguments
        out = json.loads(
            memory.tools.run({"function": {"name": "memory_recall", "arguments": raw}}, conv)
        )
        assert set(out) <= {"error", "memories", "history"}
        for row in out.get("memories", []):
            assert "bob" not in row["value"]
        for message in out.get("history", []):
            assert "bob's" not in message["content"]
    assert _snapshot(memory) == before


@pytest.mark.parametrize("number", NUMBERS, ids=repr)
def test_t4_tool_numbers_out_of_range_are_tool_errors(memory: Memory, number: Any) -> None:
    conv = memory.conversation("agent", "cli", "numbers", owner_id="alice")
    before = _snapshot(memory)
    out = json.loads(
        memory.tools.run(
            {
                "function": {
                    "name": "memory_recall",
                    "arguments": json.dumps({"query": "x", "limit": number}),
                }
            },
            conv,
        )
    )
    valid = isinstance(number, int) and not isinstance(number, bool) and 1 <= number <= 20
    assert ("error" in out) != valid
    assert _snapshot(memory) == before


@pytest.mark.parametrize("index", range(len(TEXTS)), ids=IDS)
def test_e4_any_reviewer_output_is_parsed_or_rejected_whole(index: int) -> None:
    try:
        operations = review_answer.parse(TEXTS[index])
    except ReviewOutputError:
        return
    admitted = review_admission.admit(operations, shown=[], trust="guest").admitted
    assert all(op.op == "add" and op.category != "directive" for op in admitted)


@pytest.mark.parametrize("index", range(len(TEXTS)), ids=IDS)
def test_k4_a_guest_chat_command_of_any_text_changes_nothing(memory: Memory, index: int) -> None:
    conv = memory.conversation("agent", "cli", "guest-room", owner_id="eve", trust="guest")
    conv.append_user("hello")
    before = _snapshot(memory)
    window = conv.history()
    reply = conv.handle_command(TEXTS[index])
    parsed = commands.parse(TEXTS[index])
    assert (reply is None) == (parsed is None)
    if reply is not None:
        assert reply.startswith("Only the operator")
    assert _snapshot(memory) == before and conv.history() == window


@pytest.mark.parametrize("index", range(len(TEXTS)), ids=IDS)
def test_c5_an_agent_id_of_any_text_is_refused_or_stays_inside_the_home(
    memory: Memory, index: int
) -> None:
    text = TEXTS[index]
    before = _snapshot(memory)
    try:
        folder = prompt_dir(memory.home, text, "")
    except InvalidInputError:
        pass
    else:
        root = (memory.home.root / "memory").resolve()
        assert folder.resolve().parent == root
    try:
        memory.conversation(text, "cli", "1")
    except InvalidInputError:
        pass
    assert _snapshot(memory) == before


@pytest.mark.parametrize("index", range(len(TEXTS)), ids=IDS)
def test_h3_any_text_as_a_chats_ids_a_row_filter_or_a_transcript_is_refused_or_changes_nothing(
    memory: Memory, index: int
) -> None:
    text = TEXTS[index]
    before = _snapshot(memory)
    for call in (
        lambda: memory.conversation("agent", text, text, text, owner_id=text).history(),
        lambda: memory.list_rows(owner_id=text, key=text),
        lambda: memory.voice_transcript("agent", text, "user", text, owner_id=text),
    ):
        try:
            result = call()
        except InvalidInputError:
            continue
        assert not result  # nothing is stored under it; transcripts are off by default
    assert _snapshot(memory) == before


def _toml_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value) if not isinstance(value, float) else repr(value)
    return "[]" if isinstance(value, list) else "{}"


@pytest.mark.parametrize("number", NUMBERS, ids=repr)
def test_e8_a_config_number_is_accepted_only_when_valid(tmp_path: Path, number: Any) -> None:
    literal = _toml_value(number)
    if literal is None:
        return
    path = tmp_path / "config.toml"
    path.write_text(f"[fermix_core.memory]\nreview_max_messages = {literal}\n")
    valid = isinstance(number, int) and not isinstance(number, bool) and number >= 1
    try:
        config = load_config(path)
    except ConfigError as exc:
        assert not valid and "review_max_messages" in str(exc) and str(path) in str(exc)
    else:
        assert valid and config.memory.review_max_messages == number


@pytest.mark.parametrize("index", range(len(TEXTS)), ids=IDS)
def test_e8_a_config_string_of_any_text_loads_or_is_a_config_error(
    tmp_path: Path, index: int
) -> None:
    path = tmp_path / "config.toml"
    try:
        literal = json.dumps(TEXTS[index], ensure_ascii=False)
        path.write_text(f"[fermix_core.model]\nprimary = {literal}\n", encoding="utf-8")
    except UnicodeEncodeError:
        path.write_bytes(b'[fermix_core.model]\nprimary = "\xed\xa0\x80"\n')
    try:
        load_config(path)
    except ConfigError:
        pass


@pytest.mark.parametrize("index", range(len(TEXTS)), ids=IDS)
def test_h3_cli_arguments_of_any_text_give_an_exit_code_not_a_traceback(
    memory: Memory, index: int, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(memory.home.root)
    before = _snapshot(memory)
    for argv in (
        ["memory", "search", TEXTS[index], "--json"],
        ["memory", "show", TEXTS[index]],
        ["resource", "history", "user_md", "--agent", TEXTS[index]],
    ):
        try:
            code = main(["--home", home, *argv])
        except SystemExit as exc:  # argparse refusing the arguments
            code = exc.code if isinstance(exc.code, int) else 2
        assert code in (0, 1, 2, 3)
        assert "Traceback" not in capsys.readouterr().err
    assert _snapshot(memory) == before


def test_s2_a_file_that_is_not_a_database_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(FermixError):
        open_database(path)
    assert path.read_bytes() == b"this is not sqlite" * 100
    Home(tmp_path)  # a home around it is still a valid path
    assert isinstance(apsw.sqlite_lib_version(), str)
