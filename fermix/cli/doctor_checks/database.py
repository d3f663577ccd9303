"""The database's checks: it opens with a current schema (S2), its integrity check, and each
FTS mirror against its content table (S4, S5).

Each reads through :func:`~fermix.storage.inspect_storage` (SQLite's ``Database.inspect``
or PostgreSQL's ``PgDatabase.inspect``, B1), which neither creates, migrates nor writes;
the queries are the storage port's health operations.
"""

from __future__ import annotations

from fermix.cli.doctor_checks.outcome import Check
from fermix.config import STORAGE_URL_ENV, Config
from fermix.errors import FermixError, SchemaTooNewError
from fermix.home import Home
from fermix.storage import Inspection, Storage, inspect_storage
from fermix.storage.integrity import fts_damage, is_fts_damage
from fermix.storage.opening import uses_postgres

_RESTORE = "restore memory.db from a backup; fermix cannot open it and did not change it"
_REACH = (
    "check that the PostgreSQL server runs and that the URL ([fermix_core.storage] url or"
    f" {STORAGE_URL_ENV}) and its credentials are right; fermix changed nothing"
)


def open_database(home: Home, config: Config) -> tuple[Check, Storage | None]:
    """Open the store ``config`` chooses to inspect it, and say whether its schema is
    current (S2): ``memory.db``, or the PostgreSQL database (B1).

    Nothing is created or migrated; the store is returned (to be closed by the caller)
    unless it cannot be inspected.
    """
    postgres = uses_postgres(config)
    path = home.db_path
    if not postgres and not path.exists():
        hint = "any command creates it; `fermix doctor --fix` creates it now"
        return Check("database", "warn", f"{path.name} does not exist yet", hint, "migrate"), None
    hint = _REACH if postgres else _RESTORE
    try:
        db = inspect_storage(home, config)
    except SchemaTooNewError as exc:
        return Check("database", "fail", str(exc), "upgrade fermix; nothing was changed"), None
    except FermixError as exc:
        return Check("database", "fail", str(exc), hint), None
    try:
        with db.inspection() as reads:
            version = reads.schema_version()
            pending = reads.pending_migrations()
    except FermixError as exc:
        db.close()
        return Check("database", "fail", f"{db.name} cannot be read: {exc}", hint), None
    if pending:
        hint = "every command applies them at start; `fermix doctor --fix` applies them now"
        summary = f"schema v{version}, {pending} migration(s) to v{version + pending} pending"
        return Check("database", "warn", summary, hint, "migrate"), db
    return Check("database", "pass", f"{db.name} opens; schema v{version} is current"), db


def check_integrity(
    reads: Inspection, *, full: bool = False, postgres: bool = False
) -> tuple[Check, list[str]]:
    """The store's integrity check (quick, or full with ``full``), and every problem it
    found: SQLite's, or on PostgreSQL amcheck's where it is installed.

    Damage to an FTS index alone only warns: :func:`check_fts` is the check to act on.
    """
    name = reads.integrity_check_name(full=full)
    problems = reads.integrity_problems(full=full)
    if not problems:
        more = "" if full or postgres else " (`fermix doctor --full` runs integrity_check)"
        return Check("integrity", "pass", f"{name}: ok{more}"), problems
    serious = [p for p in problems if not is_fts_damage(p)]
    if not serious:
        summary = f"{name}: only FTS index damage ({problems[0]})"
        return Check("integrity", "warn", summary, "see the FTS mirror checks below"), problems
    hint = (
        "an index is damaged: REINDEX it (the problem names it), or restore a backup"
        if postgres
        else "the database file is damaged; stop every fermix process, copy memory.db aside"
        " and restore a backup, or salvage it with `sqlite3 memory.db .recover`"
    )
    summary = f"{name}: {len(serious)} problem(s): {serious[0]}"
    details = [{"problem": p} for p in problems]
    return Check("integrity", "fail", summary, hint, details=details), problems


def check_fts(
    reads: Inspection,
    table: str,
    *,
    full: bool = False,
    integrity: list[str] | None = None,
    postgres: bool = False,
) -> Check:
    """One FTS mirror against its content table (S4, S5).

    Quick: the same rowids as its content table, and a sound index (read from
    ``integrity``, the integrity check's problems, when that check ran). Full: every row's
    terms too. A row missing from the mirror, a ghost row only in it, or damage is found.
    On PostgreSQL the mirror is each row's stems, sampled against their text.
    """
    problem = None if integrity is None else fts_damage(integrity, table)
    if problem is None:
        problem = reads.fts_problem(table, full=full, structure_checked=integrity is not None)
    if problem is not None:
        how = "recomputes the stems" if postgres else "rebuilds it from its content table"
        hint = f"`fermix doctor --fix` {how}" + ("" if postgres else " (VALUES('rebuild'))")
        return Check(table, "fail", f"index and content table disagree ({problem})", hint, "fts")
    return Check(table, "pass", "matches its content table")
