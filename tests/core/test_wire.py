"""fermix's values on the wire round-trip equal: handles and the model's dataclasses (N1)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from factories import memory_row
from hypothesis import given, settings
from hypothesis import strategies as st

from fermix import wire
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult, Skip
from fermix.errors import InvalidInputError
from fermix.model import (
    ConversationKey,
    ConversationState,
    JobCaller,
    JobRun,
    Message,
    Resource,
    Revision,
    ScheduledJob,
)

# Any text an identifier may be: no control characters, no lone surrogates, <= 200 chars.
_ID_CHARS = st.characters(blacklist_categories=("Cc", "Cs"))
ids = st.text(_ID_CHARS, min_size=1, max_size=200).filter(lambda t: t.strip() != "")
optional_ids = st.text(_ID_CHARS, max_size=200)
trusts = st.sampled_from(["operator", "guest"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


def _through_json(value: Any) -> Any:
    """What the other side reads: the value serialised and parsed, as over HTTP."""
    return json.loads(json.dumps(value, ensure_ascii=False))


@settings(max_examples=300, deadline=None)
@given(ids, ids, ids, optional_ids, optional_ids, trusts)
def test_n1_a_handle_round_trips_any_identifiers(
    agent: str, channel: str, chat: str, thread: str, owner: str, trust: str
) -> None:
    key = ConversationKey(agent, channel, chat, thread)
    handle = wire.encode_handle(key, owner, trust)
    assert len(handle) <= wire.MAX_HANDLE_CHARS
    assert handle.isascii() and "=" not in handle and "/" not in handle and "+" not in handle
    assert wire.decode_handle(handle) == (key, owner, trust)


def _encoded(value: Any) -> str:
    raw = json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "handle",
    [
        "",
        "not a handle!",
        "a" * (wire.MAX_HANDLE_CHARS + 1),
        "A",  # one base64 character decodes to nothing whole
        _encoded({"agent_id": "a"}),
        _encoded(["a", "c", "1", "", "o"]),
        _encoded(["a", "c", "1", "", "o", "root"]),
        _encoded(["a", "c", "", "", "o", "guest"]),
        _encoded(["a", "c", "1", "", "o\x00", "guest"]),
        _encoded(["a", 1, "1", "", "o", "guest"]),
        base64.urlsafe_b64encode(b"\xff\xfe").decode().rstrip("="),
    ],
)
def test_n1_a_bad_handle_is_refused_naming_the_path(handle: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        wire.decode_handle(handle)
    assert isinstance(caught.value, wire.HandleError)
    assert caught.value.field == "path.handle"


messages = st.builds(
    Message,
    id=st.integers(1, 2**62),
    agent_id=ids,
    owner_id=optional_ids,
    channel=ids,
    chat_id=ids,
    thread_scope=optional_ids,
    sender=optional_ids,
    role=st.sampled_from(["user", "assistant", "system", "tool"]),
    kind=ids,
    content=st.text(max_size=200),
    metadata_json=st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(
        lambda d: json.dumps(d, ensure_ascii=False, sort_keys=True) if d else "{}"
    ),
    created_at=st.integers(0, 2**62),
    trust=trusts,
    client_key=st.none() | ids,
)


@settings(max_examples=200, deadline=None)
@given(messages)
def test_n1_a_message_round_trips_with_its_metadata_as_an_object(message: Message) -> None:
    document = wire.message_json(message)
    assert document["metadata"] == message.metadata
    assert "metadata_json" not in document
    assert wire.message_from_json(_through_json(document)) == message
    assert wire.to_json(message) == document


KEY = ConversationKey("assistant", "telegram", "42", "t")


@pytest.mark.parametrize(
    "value",
    [
        memory_row(archived_at=5, archived_by="op", archive_reason="wrong", confidence=0.5),
        memory_row(confidence=1),
        Revision(1, "a", "o", "user_md", 3, "# USER\n", "sha", "rollback:2", 9),
        ScheduledJob(1, "a", "", "daily", "0 9 * * *", "Sum up", 4, True, None, 1, 2),
        JobRun(7, 1, "failed", "", "boom", 10, 11),
        Resource(1, "a", "o", "memory_md", 2, 5),
        JobCaller("a", 4, "o", 7),
        ConversationState(
            *KEY.as_tuple(), "alice", "guest", 3, None, 5, 4, None, None, None, 1234, None, 1, 2
        ),
        ReviewResult(KEY, "skipped", skip=Skip.NO_MODEL, refused=["x"], tried=(("m1", "timeout"),)),
        ReviewResult(KEY, "applied", added=2, replaced=1, messages=3, model="m1"),
        CompactionResult(KEY, "compacted", summarized=10, kept=4, before_tokens=900, model="m"),
    ],
    ids=lambda value: type(value).__name__,
)
def test_n1_the_models_dataclasses_round_trip(value: Any) -> None:
    document = _through_json(wire.to_json(value))
    assert wire.from_json(type(value), document) == value


def test_n1_enums_go_as_values_and_keys_as_their_fields() -> None:
    document = wire.to_json(ReviewResult(KEY, "skipped", skip=Skip.CLAIMED))
    assert document["skip"] == "claimed"
    assert document["key"] == {
        "agent_id": "assistant",
        "channel": "telegram",
        "chat_id": "42",
        "thread_scope": "t",
    }


def test_n1_unknown_fields_are_ignored_and_missing_ones_named() -> None:
    run = JobRun(7, 1, "running", "", None, 10, None)
    newer = {**wire.to_json(run), "added_by_a_newer_server": 1}
    assert wire.run_from_json(newer) == run
    partial = {k: v for k, v in wire.to_json(run).items() if k != "status"}
    with pytest.raises(wire.WireError, match="status") as caught:
        wire.run_from_json(partial)
    assert caught.value.field == "status"
    with pytest.raises(wire.WireError, match="int"):
        wire.run_from_json({**wire.to_json(run), "id": "seven"})
    with pytest.raises(wire.WireError, match="object"):
        wire.message_from_json(["not", "an", "object"])
