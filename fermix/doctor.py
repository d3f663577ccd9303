"""Health checks of a fermix home, and the repairs that are safe to make (S1, S2, S4, S5, C5, E2).

Each check reads and returns a :class:`Check`: a status, a one-line summary, a hint saying
what to do, and the :data:`Fix` that repairs it when one can. Only derived state is ever
repaired: an FTS mirror is rebuilt from its content table, a prompt file re-rendered from
its rows, an expired review claim released (any reviewer would take it over), pending
migrations applied (as any command does at start). ``memory.db`` is never rewritten, and
litellm is imported only by :func:`check_model`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import apsw

from fermix import model
from fermix.config import Config, load_config
from fermix.errors import ConfigError, FermixError, SchemaTooNewError, UnsafePathSegmentError
from fermix.home import Home
from fermix.storage import connection, conversations, migrations
from fermix.storage.connection import fetch_rows, transaction

Status = Literal["pass", "info", "warn", "fail", "skip"]
Fix = Literal["migrate", "fts", "prompt_files", "claims"]
"""What :func:`apply_fixes` can do: migrate, rebuild an FTS mirror, re-render, release."""

FTS_TABLES = ("messages_fts", "memories_fts")
LOW_DISK_BYTES = 1 << 30
LOW_DISK_FRACTION = 0.05
GATES_SHOWN = 5
TINY_PROMPT = ({"role": "user", "content": "Say OK."},)
"""The one message of a route test: it costs a handful of tokens."""


@dataclass(frozen=True)
class Check:
    """The outcome of one check."""

    name: str
    status: Status
    summary: str
    hint: str = ""
    fix: Fix | None = None
    """What repairs what this check found, when it found something repairable."""
    details: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "hint": self.hint,
            "fixable": self.fix is not None,
            "details": self.details,
        }


@dataclass(frozen=True)
class Report:
    """Every check's outcome, and what ``--fix`` did before they ran."""

    home: Path
    checks: list[Check]
    fixed: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether any check failed."""
        return any(c.status == "fail" for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "home": str(self.home),
            "ok": not self.failed,
            "fixed": self.fixed,
            "checks": [c.as_dict() for c in self.checks],
        }


def check_config(home: Home) -> tuple[Check, Config]:
    """config.toml loads; on failure the checks go on with every default."""
    path = home.config_path
    try:
        config = load_config(path)
    except ConfigError as exc:
        hint = "fix it with `fermix config set KEY VALUE` or by hand (`fermix config path`)"
        return Check("config", "fail", str(exc), hint), Config()
    if not path.exists():
        hint = "`fermix setup` writes one"
        return Check("config", "info", "no config.toml: every default", hint), config
    return Check("config", "pass", f"{path.name} loads"), config


def open_database(home: Home) -> tuple[Check, apsw.Connection | None]:
    """Open memory.db without migrating it, and say whether its schema is current (S2)."""
    path = home.db_path
    if not path.exists():
        hint = "any command creates it; `fermix doctor --fix` creates it now"
        return Check("database", "warn", f"{path.name} does not exist yet", hint, "migrate"), None
    conn: apsw.Connection | None = None
    try:
        conn = connection.raw_connect(path)
        migrations.check_version(conn)
        connection.apply_settings(conn)
        version = migrations.current_version(conn)
        pending = migrations.pending(conn)
    except (apsw.Error, FermixError) as exc:
        if conn is not None:
            conn.close()
        if isinstance(exc, SchemaTooNewError):
            return Check("database", "fail", str(exc), "upgrade fermix; nothing was changed"), None
        hint = "restore memory.db from a backup; fermix cannot open it and did not change it"
        return Check("database", "fail", f"{path.name} cannot be read: {exc}", hint), None
    latest = migrations.latest_version()
    if pending:
        hint = "every command applies them at start; `fermix doctor --fix` applies them now"
        summary = f"schema v{version}, {len(pending)} migration(s) to v{latest} pending"
        return Check("database", "warn", summary, hint, "migrate"), conn
    return Check("database", "pass", f"{path.name} opens; schema v{version} is current"), conn


def check_integrity(conn: apsw.Connection) -> Check:
    """``PRAGMA integrity_check``; damage to an FTS index alone is left to :func:`check_fts`."""
    problems = [str(row[0]) for row in conn.execute("PRAGMA integrity_check")]
    if problems == ["ok"]:
        return Check("integrity", "pass", "PRAGMA integrity_check: ok")
    fts_only = [p for p in problems if not p.startswith("fts5:")]
    if not fts_only:
        summary = f"PRAGMA integrity_check: only FTS index damage ({problems[0]})"
        return Check("integrity", "warn", summary, "see the FTS mirror checks below")
    hint = (
        "the database file is damaged; stop every fermix process, copy memory.db aside and"
        " restore a backup, or salvage it with `sqlite3 memory.db .recover`"
    )
    summary = f"PRAGMA integrity_check: {len(fts_only)} problem(s): {fts_only[0]}"
    return Check("integrity", "fail", summary, hint, details=[{"problem": p} for p in problems])


def check_fts(conn: apsw.Connection, table: str) -> Check:
    """FTS5 ``integrity-check`` of one mirror against its content table (S4, S5).

    The ``rank = 1`` form also compares the index with the external content table, so a
    row missing from the mirror, or a ghost row only in it, is found as well as damage.
    """
    try:
        conn.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)")
    except apsw.Error as exc:
        hint = "`fermix doctor --fix` rebuilds it from its content table (VALUES('rebuild'))"
        summary = f"index and content table disagree ({type(exc).__name__}: {exc})"
        return Check(table, "fail", summary, hint, "fts")
    return Check(table, "pass", "matches its content table")


def rebuild_fts(conn: apsw.Connection, table: str) -> None:
    """Rebuild one FTS5 mirror from its content table, in one transaction."""
    with transaction(conn):
        conn.execute(f"INSERT INTO {table} ({table}) VALUES ('rebuild')")


def stale_prompt_files(conn: apsw.Connection, home: Home) -> tuple[int, list[dict[str, Any]]]:
    """How many prompt files were compared, and those that differ from a fresh render (C5)."""
    from fermix.core import render
    from fermix.runtime import prompt_files

    agents = fetch_rows(conn, "SELECT agent_id FROM memories UNION SELECT agent_id FROM resources")
    compared = 0
    stale: list[dict[str, Any]] = []
    for (agent_id,) in agents:
        for owner_id in prompt_files.owners_of(conn, agent_id):
            try:
                folder = prompt_files.prompt_dir(home, agent_id, owner_id)
            except UnsafePathSegmentError:
                continue  # ids that cannot name a folder have no prompt files
            rows = prompt_files.load_rows(conn, agent_id, owner_id)
            fresh = render.render_files(rows, agent_id=agent_id, owner_id=owner_id)
            on_disk = prompt_files.read_files(home, agent_id, owner_id)
            for spec, want, have in zip(render.FILES, fresh, on_disk, strict=True):
                compared += 1
                if want != have:
                    path = folder / spec.filename
                    state = "missing" if not path.exists() else "differs from its rows"
                    stale.append(
                        {"agent_id": agent_id, "owner_id": owner_id, "file": str(path)}
                        | {"state": state}
                    )
    return compared, stale


def check_prompt_files(conn: apsw.Connection, home: Home) -> Check:
    """Every USER.md and MEMORY.md equals a fresh render of its rows (S1, C5)."""
    compared, stale = stale_prompt_files(conn, home)
    if not stale:
        return Check("prompt files", "pass", f"{compared} prompt file(s) match their rows")
    summary = f"{len(stale)} of {compared} prompt file(s) differ from a fresh render of their rows"
    hint = (
        "the files are derived from memory.db; `fermix doctor --fix` renders them again"
        " (a hand edit is lost: store lasting facts as memory rows instead)"
    )
    return Check("prompt files", "fail", summary, hint, "prompt_files", stale)


def rerender_prompt_files(conn: apsw.Connection, home: Home) -> int:
    """Rebuild every stale prompt file's agent and owner; return how many files were stale."""
    from fermix.runtime import prompt_files

    _, stale = stale_prompt_files(conn, home)
    for agent_id, owner_id in sorted({(s["agent_id"], s["owner_id"]) for s in stale}):
        prompt_files.rebuild(conn, home, agent_id, owner_id, reason="doctor")
    return len(stale)


def _conversation(state: model.ConversationState) -> str:
    return f"{state.agent_id}/{state.key.scope_id}"


def check_claims(conn: apsw.Connection, *, now: int) -> Check:
    """No review claim is held past its expiry (E2): its reviewer died mid-review."""
    stale = [
        s
        for s in conversations.list_states(conn)
        if s.review_claim_token is not None
        and s.review_claim_expires_at is not None
        and s.review_claim_expires_at <= now
    ]
    if not stale:
        return Check("review claims", "pass", "no review claim is past its expiry")
    details = [
        {"conversation": _conversation(s), "expired_at": s.review_claim_expires_at} for s in stale
    ]
    summary = f"{len(stale)} review claim(s) held past their expiry"
    hint = (
        "a reviewer stopped mid-review (killed or crashed); `fermix doctor --fix` releases"
        " the claims (the next review would also take them over)"
    )
    return Check("review claims", "fail", summary, hint, "claims", details)


def release_claims(conn: apsw.Connection, *, now: int) -> int:
    """Release every expired review claim; return how many."""
    with transaction(conn):
        return conversations.release_expired_claims(conn, now=now)


def _gate_row(
    state: model.ConversationState, pending: int, config: Config, *, now: int
) -> dict[str, Any]:
    """One conversation's review gate (E2) as the reviewer would see it now."""
    from fermix.core import review

    cfg = config.memory
    skip = review.gate(
        state,
        now_ms=now,
        interval_hours=cfg.review_interval_hours,
        backoff_ms=cfg.review_failure_backoff_ms,
        newest_user_message_id=state.last_reviewed_message_id + pending,
    )
    expires = state.review_claim_expires_at
    if state.review_claim_token is not None and expires is not None and expires > now:
        gate = "claimed (a review is running)"
    else:
        gate = "due" if skip is None else skip.value
    failed_at = state.review_failed_at
    backoff_until = None if failed_at is None else failed_at + cfg.review_failure_backoff_ms
    return {
        "conversation": _conversation(state),
        "pending": pending,
        "last_reviewed_at": state.last_reviewed_at,
        "last_failed_at": failed_at,
        "backoff_until": backoff_until if backoff_until and backoff_until > now else None,
        "gate": gate,
    }


def check_review_gates(conn: apsw.Connection, config: Config, *, now: int) -> Check:
    """The reviewer's gates (E2) of the conversations with the most unreviewed messages."""
    pending = conversations.with_new_user_messages(conn)
    if not pending:
        return Check("review gates", "pass", "no conversation has unreviewed user messages")
    rows = [_gate_row(state, count, config, now=now) for state, count in pending]
    due = sum(1 for row in rows if row["gate"] == "due")
    shown = f"; the top {GATES_SHOWN} below" if len(rows) > GATES_SHOWN else ""
    summary = f"{len(rows)} conversation(s) with unreviewed user messages, {due} due now{shown}"
    details = rows[:GATES_SHOWN]
    failed = [row for row in details if row["last_failed_at"] is not None]
    if failed:
        hint = (
            f"the last review of {failed[0]['conversation']} failed; see the supervisor log,"
            " or run `fermix memory review --now` to see the error"
        )
        return Check("review gates", "warn", summary, hint, details=details)
    if config.memory.review_interval_hours == 0:
        hint = "background review is off (review_interval_hours = 0); `--now` still works"
    else:
        hint = "reviews run after a conversation's next turn, or `fermix memory review --now`"
    return Check("review gates", "info", summary, hint, details=details)


def check_disk(home: Home, usage: Callable[[str], Any] = shutil.disk_usage) -> Check:
    """Free space on the home's file system: warn under 1 GiB or 5 %."""
    where = home.root
    while not where.exists() and where != where.parent:
        where = where.parent
    total, _used, free = usage(str(where))[:3]
    shown = f"{free / (1 << 30):.1f} GiB free ({free / total:.0%} of {total / (1 << 30):.1f} GiB)"
    if free < LOW_DISK_BYTES or free < LOW_DISK_FRACTION * total:
        hint = "SQLite needs room for its WAL and for checkpoints; free some space"
        return Check("disk", "warn", shown, hint)
    return Check("disk", "pass", shown)


def check_model(config: Config) -> Check:
    """One tiny call through the configured route (imports litellm)."""
    from fermix import llm

    route = llm.Route.from_config(config.model)
    if route.primary is None:
        return Check("model", "warn", "no model is configured", "`fermix setup` sets the route")
    try:
        answer = llm.complete(route, TINY_PROMPT, agent="doctor", max_tokens=5)
    except FermixError as exc:
        hint = "check the model names, api_base and api_key_env (`fermix config show`)"
        return Check("model", "fail", str(exc), hint)
    summary = f"{answer.model} answered in {answer.latency_ms:.0f} ms"
    if answer.tried:
        summary += f", after {len(answer.tried)} failed attempt(s)"
    return Check("model", "pass", summary)


def run_checks(home: Home, *, now: int, model_check: bool = False) -> list[Check]:
    """Run every check in order; the database checks only when its schema is current."""
    config_check, config = check_config(home)
    checks = [config_check]
    db_check, conn = open_database(home)
    checks.append(db_check)
    if conn is not None:
        try:
            if db_check.status == "pass":
                checks += [
                    _guarded("integrity", partial(check_integrity, conn)),
                    *(_guarded(table, partial(check_fts, conn, table)) for table in FTS_TABLES),
                    _guarded("prompt files", partial(check_prompt_files, conn, home)),
                    _guarded("review claims", partial(check_claims, conn, now=now)),
                    _guarded("review gates", partial(check_review_gates, conn, config, now=now)),
                ]
        finally:
            conn.close()
    checks.append(_guarded("disk", partial(check_disk, home)))
    if model_check:
        checks.append(check_model(config))
    else:
        hint = "`fermix doctor --model-check` makes one tiny call"
        checks.append(Check("model", "skip", "not checked", hint))
    return checks


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    """Run one check; an error it meets becomes its failure, so the other checks still run."""
    try:
        return check()
    except (apsw.Error, FermixError, OSError) as exc:
        hint = "the check itself could not run; the error says why"
        return Check(name, "fail", f"{type(exc).__name__}: {exc}", hint)


def apply_fixes(home: Home, checks: list[Check], *, now: int) -> list[str]:
    """Repair what ``checks`` found that can be repaired safely; say what was done."""
    wanted = {c.fix for c in checks if c.fix is not None and c.status in ("warn", "fail")}
    if not wanted:
        return []
    done = []
    existed = home.db_path.exists()
    conn = connection.open_database(home.db_path)  # creates the file, applies migrations
    try:
        if "migrate" in wanted:
            version = migrations.current_version(conn)
            done.append(
                f"applied migrations up to schema v{version}"
                if existed
                else f"created {home.db_path.name} at schema v{version}"
            )
        for check in checks:
            if check.fix == "fts" and check.name in FTS_TABLES:
                rebuild_fts(conn, check.name)
                done.append(f"rebuilt {check.name} from its content table")
        if "prompt_files" in wanted:
            done.append(f"re-rendered {rerender_prompt_files(conn, home)} prompt file(s)")
        if "claims" in wanted:
            done.append(f"released {release_claims(conn, now=now)} expired review claim(s)")
    finally:
        conn.close()
    return done


def diagnose(home: Home, *, now: int, fix: bool = False, model_check: bool = False) -> Report:
    """Check ``home``; with ``fix``, repair what can be repaired and report the state after."""
    checks = run_checks(home, now=now, model_check=model_check and not fix)
    if not fix:
        return Report(home.root, checks)
    fixed = apply_fixes(home, checks, now=now)
    after = run_checks(home, now=now, model_check=model_check)
    return Report(home.root, after, fixed)
