"""Response models derived from the vocabulary's dataclasses (N1).

A response that carries a fermix type (a message, a memory row, a review's result, ...)
is documented and checked by a pydantic model made here from the dataclass itself:
:func:`fermix.wire.wire_fields` gives its fields and type hints, as the codec writes
them, and :func:`derive` builds the model with the name the OpenAPI document shows. What
the server adds is only prose: the model's description and its fields'. A description of
a field the dataclass does not have is an error at import, so prose cannot outlive the
field it describes; a field added to the dataclass is in the model, the document and the
client's reading at once.

Every field of a response model is required: the server always writes every field.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, create_model

from fermix import wire

__all__ = ["derive", "derived_models"]

_DERIVED: dict[type, type[BaseModel]] = {}


def derive(
    source: type,
    name: str,
    doc: str,
    /,
    *,
    narrowed: Mapping[str, Any] | None = None,
    **descriptions: str,
) -> type[BaseModel]:
    """The response model ``name`` of dataclass ``source``: its wire fields, in order.

    ``descriptions`` are the fields' descriptions in the OpenAPI document, by field name.
    ``narrowed`` gives a field a narrower type than the dataclass declares (a ``Literal``
    of the values a plain ``str`` holds). A dataclass field of another derived type
    becomes that type's model, so derive the parts first.
    """
    fields = dict(wire.wire_fields(source))
    narrowed = narrowed or {}
    stale = sorted((set(descriptions) | set(narrowed)) - set(fields))
    if stale:
        raise TypeError(f"{name} names fields {source.__name__} does not have: {stale}")
    definitions: dict[str, Any] = {
        field: (narrowed.get(field, _on_wire(hint)), Field(description=descriptions.get(field)))
        for field, hint in fields.items()
    }
    model: type[BaseModel] = create_model(name, __doc__=doc, **definitions)
    _DERIVED[source] = model
    return model


def derived_models() -> dict[type, type[BaseModel]]:
    """Every derived model, by the dataclass it is derived from."""
    return dict(_DERIVED)


def _on_wire(hint: Any) -> Any:
    """``hint`` with each dataclass in it replaced by its derived model."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        try:
            return _DERIVED[hint]
        except KeyError:
            raise TypeError(f"derive {hint.__name__} before a model that holds one") from None
    args = typing.get_args(hint)
    if not args:
        return hint
    parts = tuple(_on_wire(arg) for arg in args)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, parts)
    return typing.get_origin(hint)[parts]
