"""The doctor's repairs (``--fix``), the only part of it that writes.

Only derived state is repaired: pending migrations applied (as any command does at start),
an FTS mirror rebuilt from its content table, prompt files rendered again from their rows
(keeping an operator's rollback, P2), expired review claims released. Besides, paths of the
home open to other accounts are made owner-only (M10), first, so that a WAL file the
database opening creates gets the database file's tightened mode.
"""

from __future__ import annotations

from collections.abc import Callable

from fermix.cli.doctor_checks.outcome import Check, Progress, quiet
from fermix.cli.doctor_checks.permissions import tighten
from fermix.config import Config
from fermix.home import Home
from fermix.runtime.composition import build
from fermix.storage import Repair
from fermix.storage.integrity import FTS_TABLES
from fermix.storage.opening import uses_postgres


def apply_fixes(
    home: Home, config: Config, checks: list[Check], *, now: int, progress: Progress = quiet
) -> list[str]:
    """Repair what ``checks`` found that can be repaired safely; say what was done.

    The store ``config`` chooses is opened as every command opens it (created when
    missing, migrated) when a repair needs it; tightening permissions alone does not open
    it, and neither does a config.toml that does not load (it may name another store).
    """
    wanted = {c.fix for c in checks if c.fix is not None and c.status in ("warn", "fail")}
    done = []
    if "permissions" in wanted:
        progress("making the home owner-only")
        done += tighten(home, database=not uses_postgres(config))
        wanted.discard("permissions")
    if not wanted:
        return done
    if any(c.name == "config" and c.status == "fail" for c in checks):
        done.append("left the database alone: config.toml does not load, and it may name it")
        return done
    existed = uses_postgres(config) or home.db_path.exists()
    progress("applying migrations" if "migrate" in wanted else "opening the database")
    services = build(home, config, readers=1)  # creates memory.db, applies migrations
    db = services.storage
    try:
        if "migrate" in wanted:
            with db.inspection() as reads:
                version = reads.schema_version()
            done.append(
                f"applied migrations up to schema v{version}"
                if existed
                else f"created {home.db_path.name} at schema v{version}"
            )
        for check in checks:
            if check.fix == "fts" and check.name in FTS_TABLES:
                table = check.name
                progress(f"rebuilding {table}")
                db.repair(_rebuild(table), label=f"doctor: rebuild {table}")
                done.append(f"rebuilt {table} from its content table")
        if "prompt_files" in wanted:
            progress("rendering prompt files")
            rebuilt = services.files.repair(reason="doctor")
            changed = sum(
                1 for r in rebuilt for f in r.files if f.written or f.revision is not None
            )
            done.append(f"re-rendered {changed} prompt file(s)")
        if "claims" in wanted:
            progress("releasing review claims")
            released = db.write(
                lambda w: w.release_expired_claims(now=now), label="doctor: release claims"
            )
            done.append(f"released {released} expired review claim(s)")
        if "erasures" in wanted:
            progress("finishing erasures")
            reports = services.forgetting.resume()
            finished = sum(1 for r in reports if r.done)
            done.append(f"finished {finished} of {len(reports)} unfinished erasure(s)")
    finally:
        services.close()
    return done


def _rebuild(table: str) -> Callable[[Repair], None]:
    """A write unit rebuilding FTS mirror ``table`` from its content table."""

    def unit(writes: Repair) -> None:
        writes.rebuild_fts(table)

    return unit
