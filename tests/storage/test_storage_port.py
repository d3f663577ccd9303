"""Both adapters offer the storage port exactly as it is declared (issue 21, B1).

The list of operations comes from the port's Protocols (:mod:`fermix.storage.port`), never
from a list kept here: an adapter that lacks one, whose operation takes other parameters,
or that offers one the port does not declare fails. The checker itself is shown to fail on
a session with an operation removed and on one with a parameter renamed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fermix.storage import port
from fermix.storage.operation import Op, Session, WriteSession
from fermix.storage.postgres.session import PgReads, PgWrites
from fermix.storage.sessions import SharedReads, SharedWrites
from fermix.storage.sqlite.session import SqliteReads, SqliteWrites

Shape = list[tuple[str, Any, Any]]

ADAPTERS = {
    "sqlite": {port.Inspection: SqliteReads, port.Repair: SqliteWrites},
    "postgres": {port.Inspection: PgReads, port.Repair: PgWrites},
}
"""Each adapter's session classes, by the widest Protocol each must satisfy."""


def port_operations(protocol: type) -> dict[str, Callable[..., Any]]:
    """Every operation ``protocol`` declares, its Protocol bases' included."""
    found: dict[str, Callable[..., Any]] = {}
    for cls in reversed(protocol.__mro__):
        if cls is object or not getattr(cls, "_is_protocol", False):
            continue
        for name, value in vars(cls).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                found[name] = value
    return found


def shape(fn: Callable[..., Any]) -> Shape:
    """The parameters after the first (the protocol's ``self``, the op's connection)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    return [(p.name, p.kind, p.default) for p in params]


def offered(session: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every operation ``session`` offers: its ``Op`` bindings and its public methods."""
    for cls in session.__mro__:
        if cls in (object, Session):
            continue
        for name, value in vars(cls).items():
            if name.startswith("_"):
                continue
            if isinstance(value, Op):
                yield name, value.function
            elif inspect.isfunction(value):
                yield name, value


def problems(protocol: type, session: type) -> list[str]:
    """How ``session`` departs from ``protocol``: missing, different, or undeclared ops."""
    declared = port_operations(protocol)
    has: dict[str, Callable[..., Any]] = {}
    for name, fn in offered(session):
        has.setdefault(name, fn)  # the most derived class's binding wins, as on access
    found = []
    for name, fn in sorted(declared.items()):
        if name not in has:
            found.append(f"{session.__name__} lacks {name}")
        elif shape(has[name]) != shape(fn):
            found.append(f"{session.__name__}.{name} takes {shape(has[name])}, not {shape(fn)}")
    extra = sorted(set(has) - set(declared) - {"shared_sql", "touch_conversation"})
    found += [
        f"{session.__name__} offers {name}, which the port does not declare" for name in extra
    ]
    return found


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_b1_each_adapter_offers_every_operation_of_the_port_with_its_signature(
    adapter: str,
) -> None:
    for protocol, session in ADAPTERS[adapter].items():
        assert problems(protocol, session) == []


def test_b1_the_port_declares_the_turns_operations_and_the_doctors_apart() -> None:
    reads, inspection = port_operations(port.Reads), port_operations(port.Inspection)
    writes, repair = port_operations(port.Writes), port_operations(port.Repair)
    assert set(reads) < set(inspection) and set(writes) < set(repair)
    assert set(reads) < set(writes)
    assert {"integrity_problems", "fts_problem", "schema_version"} <= set(inspection) - set(reads)
    assert set(repair) - set(writes) - set(inspection) == {"rebuild_fts"}
    assert len(writes) > 70  # every table family's operations, not a slice of them
    assert "lock_owner" in writes and "lock_owner" not in reads  # a lock is a write's


def test_b1_the_adapters_sessions_share_no_class_but_the_port_s_own() -> None:
    """Neither adapter inherits the other: an operation nobody wrote cannot run the other
    adapter's SQL. What they share is the operations written once for both."""
    shared_classes = {SharedReads, SharedWrites, Session, WriteSession, object}
    for sqlite_cls, pg_cls in ((SqliteReads, PgReads), (SqliteWrites, PgWrites)):
        shared = set(sqlite_cls.__mro__) & set(pg_cls.__mro__)
        assert shared <= shared_classes


def test_the_check_fails_for_a_session_that_lacks_an_operation() -> None:
    namespace = {k: v for k, v in vars(PgReads).items() if k != "search_messages"}
    broken = type("BrokenReads", (SharedReads,), namespace)
    assert problems(port.Inspection, broken) == ["BrokenReads lacks search_messages"]


def test_the_check_fails_for_an_operation_with_another_signature() -> None:
    def window(conn: Any, key: Any, *, newest: int | None = None) -> list[Any]:
        return []

    broken = type("BrokenReads", (PgReads,), {"window": Op(window)})
    [problem] = problems(port.Inspection, broken)
    assert problem.startswith("BrokenReads.window takes [('key',")
    assert "'newest'" in problem


def test_the_check_fails_for_an_operation_the_port_does_not_declare() -> None:
    def vacuum(conn: Any) -> None:
        return None

    broken = type("BrokenWrites", (PgWrites,), {"vacuum": Op(vacuum)})
    assert problems(port.Repair, broken) == [
        "BrokenWrites offers vacuum, which the port does not declare"
    ]
