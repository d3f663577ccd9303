"""The database's checks: it opens with a current schema (S2), SQLite's integrity check, and
each FTS mirror against its content table (S4, S5).

Each reads through :meth:`Database.inspect <fermix.storage.database.Database.inspect>`,
which neither creates, migrates nor writes; the queries are :mod:`fermix.storage.health`.
"""

from __future__ import annotations

from fermix.cli.doctor_checks.outcome import Check
from fermix.errors import FermixError, SchemaTooNewError
from fermix.home import Home
from fermix.storage import Database, Reads, health

FTS_TABLES = health.FTS_TABLES


def open_database(home: Home) -> tuple[Check, Database | None]:
    """Open memory.db to inspect it, and say whether its schema is current (S2).

    Nothing is created or migrated; the database is returned (to be closed by the caller)
    unless it cannot be inspected.
    """
    path = home.db_path
    if not path.exists():
        hint = "any command creates it; `fermix doctor --fix` creates it now"
        return Check("database", "warn", f"{path.name} does not exist yet", hint, "migrate"), None
    try:
        db = Database.inspect(path)
    except SchemaTooNewError as exc:
        return Check("database", "fail", str(exc), "upgrade fermix; nothing was changed"), None
    except FermixError as exc:
        hint = "restore memory.db from a backup; fermix cannot open it and did not change it"
        return Check("database", "fail", str(exc), hint), None
    try:
        with db.read() as reads:
            version = reads.schema_version()
            pending = reads.pending_migrations()
    except FermixError as exc:
        db.close()
        hint = "restore memory.db from a backup; fermix cannot open it and did not change it"
        return Check("database", "fail", f"{path.name} cannot be read: {exc}", hint), None
    if pending:
        hint = "every command applies them at start; `fermix doctor --fix` applies them now"
        summary = f"schema v{version}, {pending} migration(s) to v{health.latest_version()} pending"
        return Check("database", "warn", summary, hint, "migrate"), db
    return Check("database", "pass", f"{path.name} opens; schema v{version} is current"), db


def check_integrity(reads: Reads, *, full: bool = False) -> tuple[Check, list[str]]:
    """SQLite's integrity check (quick, or full with ``full``), and every problem it found.

    Damage to an FTS index alone only warns: :func:`check_fts` is the check to act on.
    """
    name = health.integrity_check_name(full=full)
    problems = reads.integrity_problems(full=full)
    if not problems:
        more = "" if full else " (`fermix doctor --full` runs integrity_check)"
        return Check("integrity", "pass", f"{name}: ok{more}"), problems
    serious = [p for p in problems if not health.is_fts_damage(p)]
    if not serious:
        summary = f"{name}: only FTS index damage ({problems[0]})"
        return Check("integrity", "warn", summary, "see the FTS mirror checks below"), problems
    hint = (
        "the database file is damaged; stop every fermix process, copy memory.db aside and"
        " restore a backup, or salvage it with `sqlite3 memory.db .recover`"
    )
    summary = f"{name}: {len(serious)} problem(s): {serious[0]}"
    details = [{"problem": p} for p in problems]
    return Check("integrity", "fail", summary, hint, details=details), problems


def check_fts(
    reads: Reads, table: str, *, full: bool = False, integrity: list[str] | None = None
) -> Check:
    """One FTS5 mirror against its content table (S4, S5).

    Quick: the same rowids as its content table, and a sound index (read from
    ``integrity``, the integrity check's problems, when that check ran). Full: every row's
    terms too. A row missing from the mirror, a ghost row only in it, or damage is found.
    """
    problem = None if integrity is None else health.fts_damage(integrity, table)
    if problem is None:
        problem = reads.fts_problem(table, full=full, structure_checked=integrity is not None)
    if problem is not None:
        hint = "`fermix doctor --fix` rebuilds it from its content table (VALUES('rebuild'))"
        return Check(table, "fail", f"index and content table disagree ({problem})", hint, "fts")
    return Check(table, "pass", "matches its content table")
