"""Forgetting and export over the memory server, through ``fermix.Client`` and a real server
process on 127.0.0.1 (F1, F2, F6, F8).

A host token can neither forget nor export (403), and its attempt changes nothing; the
operator token erases one owner of its agent, with an owner id that holds characters a URL
path gives meaning to; the export streams one JSON document that ``json`` reads back; an
unknown owner is a 404 and a pattern a 422, both as the fermix errors the embedded calls
raise, and neither leaves an erasure record.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from server_fixtures import AGENT, ServerProcess

from fermix.errors import AccessDeniedError, InvalidInputError, NotFoundError

OWNER = "tg:42/alice smith"
"""An owner id with a colon, a slash and a space: each must reach the server as it is."""


def _seed(server: ServerProcess) -> None:
    host = server.client()
    dm = host.conversation(AGENT, "tg", "dm", owner_id=OWNER)
    dm.append_user("my secret word is xerophilicspanglezq")
    dm.append_assistant("noted")
    group = host.conversation(AGENT, "tg", "group", owner_id="carol")
    group.append_user("from the group xerophilicgroupzq", owner_id=OWNER)
    group.append_user("carol says hi", owner_id="carol")


def test_f8_a_host_token_can_neither_forget_nor_export(server: ServerProcess) -> None:
    _seed(server)
    host = server.client()
    with pytest.raises(AccessDeniedError):
        host.forget_owner(OWNER, agent_id=AGENT)
    with pytest.raises(AccessDeniedError):
        host.export_owner(OWNER, io.BytesIO(), agent_id=AGENT)
    with pytest.raises(AccessDeniedError):
        host.erasures()
    dm = host.conversation(AGENT, "tg", "dm", owner_id=OWNER)
    assert len(dm.history()) == 2  # nothing was erased
    with pytest.raises(AccessDeniedError):
        dm.forget()
    assert len(dm.history()) == 2


def test_f1_f6_the_operator_exports_then_forgets_an_owner_of_its_agent(
    server: ServerProcess, tmp_path: Path
) -> None:
    _seed(server)
    operator = server.client(server.operator_token)
    with pytest.raises(InvalidInputError, match="agent_id"):
        operator.forget_owner(OWNER)

    out = tmp_path / "export.json"
    written = operator.export_owner(OWNER, out, agent_id=AGENT)
    assert written == out.stat().st_size and out.stat().st_mode & 0o077 == 0
    document = json.loads(out.read_text(encoding="utf-8"))
    assert (document["format"], document["version"]) == ("fermix-owner-export", 1)
    assert document["owner_id"] == OWNER
    contents = [m["content"] for m in document["messages"]]
    assert contents == [
        "my secret word is xerophilicspanglezq",
        "noted",
        "from the group xerophilicgroupzq",
    ]
    assert "carol says hi" not in out.read_text(encoding="utf-8")
    assert [c["chat_id"] for c in document["conversations"]] == ["dm"]

    report = operator.forget_owner(OWNER, agent_id=AGENT)
    assert report.done and report.counts["messages"] == 3
    assert report.counts["conversations"] == 1
    host = server.client()
    group = host.conversation(AGENT, "tg", "group", owner_id="carol")
    assert [m.content for m in group.history()] == ["carol says hi"]
    assert host.conversation(AGENT, "tg", "dm", owner_id=OWNER).history() == []
    (audit,) = operator.erasures()
    assert audit.requested_by.startswith("token operator")
    assert OWNER not in json.dumps(audit.as_dict()) and audit.state == "done"

    with pytest.raises(NotFoundError):
        operator.forget_owner(OWNER, agent_id=AGENT)
    with pytest.raises(NotFoundError):
        operator.export_owner(OWNER, io.BytesIO(), agent_id=AGENT)
    with pytest.raises(InvalidInputError):
        operator.forget_owner("*", agent_id=AGENT)
    assert len(operator.erasures()) == 1


def test_f2_the_operator_forgets_a_message_a_row_and_a_conversation(
    server: ServerProcess,
) -> None:
    _seed(server)
    operator = server.client(server.operator_token)
    dm = operator.conversation(AGENT, "tg", "dm", owner_id=OWNER)
    first, second = dm.history()
    assert operator.forget_message(first.id).counts == {"messages": 1}
    assert [m.id for m in dm.history()] == [second.id]
    with pytest.raises(NotFoundError):
        operator.forget_message(first.id)
    with pytest.raises(NotFoundError):
        operator.forget_memory(2**40)
    report = dm.forget()
    assert report.done and report.counts == {"messages": 1, "conversations": 1}
    assert dm.history() == []
