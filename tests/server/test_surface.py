"""The embedded and remote facades offer one surface, declared once in ``fermix.surface`` (N1).

mypy --strict checks that ``Memory`` and ``Client`` (and their conversations) satisfy the
Protocols, types and all (``fermix/surface.py``'s last lines). It lets a positional
parameter's name differ, which a host calling by keyword would feel, so these tests read
the Protocols and hold every facade method to the Protocol's parameter names, kinds and
defaults: a method added to the Protocol is checked here without another list to keep.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from fermix.api import Memory
from fermix.conversation import Conversation
from fermix.remote import Client, RemoteConversation, RemoteTools
from fermix.surface import ConversationSurface, MemorySurface, ToolsSurface
from fermix.tools import MemoryTools

_DUNDERS = {"__enter__", "__exit__"}


def methods_of(protocol: type) -> list[str]:
    """The methods a Protocol declares (its properties are mypy's to check)."""
    return sorted(
        name
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and (not name.startswith("_") or name in _DUNDERS)
    )


def shape(function: Any) -> list[tuple[str, Any, Any]]:
    """A signature without its annotations: each parameter's name, kind and default."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


CASES = [
    (protocol, facade, name)
    for protocol, facades in (
        (MemorySurface, (Memory, Client)),
        (ConversationSurface, (Conversation, RemoteConversation)),
        (ToolsSurface, (MemoryTools, RemoteTools)),
    )
    for facade in facades
    for name in methods_of(protocol)
]


@pytest.mark.parametrize(
    ("protocol", "facade", "name"),
    CASES,
    ids=[f"{facade.__name__}.{name}" for _, facade, name in CASES],
)
def test_n1_every_facade_method_has_the_surfaces_parameters(
    protocol: type, facade: type, name: str
) -> None:
    declared = shape(getattr(protocol, name))
    if isinstance(inspect.getattr_static(facade, name), staticmethod):
        declared = declared[1:]  # MemoryTools.schemas takes no self
    assert shape(getattr(facade, name)) == declared


def test_n1_the_surface_declares_what_both_facades_share() -> None:
    """Every public method both facades have is in the surface, so none is left unchecked."""
    for protocol, embedded, remote in (
        (MemorySurface, Memory, Client),
        (ConversationSurface, Conversation, RemoteConversation),
    ):
        shared = {n for n in dir(embedded) if not n.startswith("_") and n in dir(remote)}
        shared = {n for n in shared if callable(getattr(embedded, n))}
        assert shared <= set(methods_of(protocol)), protocol.__name__
    assert {"conversation", "review", "list_rows", "job_caller"} <= set(methods_of(MemorySurface))


def test_n1_the_surfaces_are_exported_for_hosts() -> None:
    import fermix

    assert fermix.MemorySurface is MemorySurface
    assert fermix.ConversationSurface is ConversationSurface
    assert {"MemorySurface", "ConversationSurface", "ToolsSurface"} <= set(fermix.__all__)
