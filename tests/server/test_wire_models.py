"""Each wire type has one definition, its dataclass: the server's response models, the
OpenAPI document and the codec are derived from it (N1).

A field added to a vocabulary dataclass must reach the derived model, the document and the
client without another edit; these tests hold every derived model to its dataclass's
fields, and grow a dataclass by a field to see it arrive.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from factories import memory_row
from fastapi import FastAPI

from fermix import wire
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult, Skip
from fermix.model import (
    ConversationKey,
    ConversationState,
    Erasure,
    ForgetReport,
    JobCaller,
    JobRun,
    MemoryRow,
    Message,
    Resource,
    Revision,
    ScheduledJob,
)
from fermix.server.http import admin, owners, turn
from fermix.server.http.wire_models import derive, derived_models

KEY = ConversationKey("assistant", "telegram", "42", "t")
SAMPLES: list[Any] = [
    Message(1, "a", "o", "c", "1", "", "o", "user", "chat", "hi", '{"n": 1}', 5, "guest", "k"),
    KEY,
    ConversationState(
        *KEY.as_tuple(), "alice", "guest", 3, None, 5, 4, None, None, None, 1234, None, 1, 2
    ),
    ReviewResult(KEY, "skipped", skip=Skip.NO_MODEL, refused=["x"], tried=(("m1", "timeout"),)),
    CompactionResult(KEY, "compacted", summarized=10, kept=4, before_tokens=900, model="m"),
    memory_row(archived_at=5, archived_by="op", archive_reason="wrong", confidence=0.5),
    Resource(1, "a", "o", "memory_md", 2, 5),
    Revision(1, "a", "o", "user_md", 3, "# USER\n", "sha", "rollback:2", 9),
    ScheduledJob(1, "a", "", "daily", "0 9 * * *", "Sum up", 4, True, None, 1, 2),
    JobRun(7, 1, "failed", "", "boom", 10, 11),
    JobCaller("a", 4, "o", 7),
    ForgetReport(3, "owner", "pending", {"messages": 4}, "a reader holds the log back"),
    Erasure(3, "owner", "a", None, "ab12", "operator", "done", {"messages": 4}, 10, 12),
]


def _app() -> FastAPI:
    """The server's routes, without a memory behind them: enough for the document."""
    app = FastAPI()
    app.include_router(turn.router, prefix="/v1")
    app.include_router(admin.router, prefix="/v1")
    app.include_router(owners.router, prefix="/v1")
    return app


def test_n1_every_type_the_routes_answer_with_has_a_derived_model() -> None:
    assert set(derived_models()) == {type(value) for value in SAMPLES}


@pytest.mark.parametrize("source", list(derived_models()), ids=lambda cls: cls.__name__)
def test_n1_a_derived_model_has_its_dataclass_fields_all_required(source: type) -> None:
    schema = derived_models()[source].model_json_schema()
    names = [name for name, _ in wire.wire_fields(source)]
    assert list(schema["properties"]) == names
    assert schema["required"] == names  # the server writes every field
    assert schema["description"]


def test_n1_the_openapi_document_shows_each_dataclass_fields() -> None:
    schemas = _app().openapi()["components"]["schemas"]
    for source, model in derived_models().items():
        names = [name for name, _ in wire.wire_fields(source)]
        assert list(schemas[model.__name__]["properties"]) == names, model.__name__


@pytest.mark.parametrize("value", SAMPLES, ids=lambda value: type(value).__name__)
def test_n1_the_codec_and_the_derived_model_agree_on_the_json(value: Any) -> None:
    document = json.loads(json.dumps(wire.to_json(value)))
    model = derived_models()[type(value)]
    assert model.model_validate(document).model_dump(mode="json") == document
    assert wire.from_json(type(value), document) == value


def test_n1_a_field_added_to_a_dataclass_reaches_the_model_and_the_codec() -> None:
    """As if ``mood`` were added to ``MemoryRow``: nothing else is edited."""
    grown = dataclasses.make_dataclass(
        "MemoryRow",
        [(f.name, f.type) for f in dataclasses.fields(MemoryRow)] + [("mood", "str | None")],
        frozen=True,
        namespace={"__module__": MemoryRow.__module__},
    )
    model = derive(grown, "GrownRowOut", "A memory row with a mood.", mood="How it felt.")
    properties = model.model_json_schema()["properties"]
    assert properties["mood"]["description"] == "How it felt."
    row = grown(**dataclasses.asdict(memory_row()), mood="glad")
    document = json.loads(json.dumps(wire.to_json(row)))
    assert document["mood"] == "glad"
    assert model.model_validate(document).model_dump(mode="json") == document
    assert wire.from_json(grown, document) == row


def test_n1_prose_for_a_field_the_dataclass_lacks_is_refused() -> None:
    with pytest.raises(TypeError, match="moood"):
        derive(JobRun, "StaleRunOut", "A run.", moood="A misspelt or removed field.")
