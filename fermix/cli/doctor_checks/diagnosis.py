"""Running the doctor's checks in order, and :func:`diagnose`: check, and with ``fix``
repair what can be repaired and check again.

A check that meets an error becomes a failure naming it, so the other checks still run.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from fermix.cli.doctor_checks.database import check_fts, check_integrity, open_database
from fermix.cli.doctor_checks.environment import check_config, check_disk, check_model
from fermix.cli.doctor_checks.fixes import apply_fixes
from fermix.cli.doctor_checks.outcome import Check, Progress, Report, quiet
from fermix.cli.doctor_checks.permissions import check_permissions
from fermix.cli.doctor_checks.prompt_files import check_prompt_files
from fermix.cli.doctor_checks.reviews import (
    check_claims,
    check_erasures,
    check_retention,
    check_review_gates,
)
from fermix.cli.doctor_checks.vectors import check_vectors
from fermix.config import Config
from fermix.errors import FermixError
from fermix.home import Home
from fermix.storage import Inspection, Storage
from fermix.storage.integrity import FTS_TABLES
from fermix.storage.opening import uses_postgres


def database_checks(
    home: Home,
    db: Storage,
    config: Config,
    *,
    now: int,
    full: bool = False,
    progress: Progress = quiet,
) -> list[Check]:
    """The checks of a database whose schema is current, each in its own read unit."""
    postgres = uses_postgres(config)

    def run(name: str, check: Callable[[Inspection], Check]) -> Check:
        progress(f"checking {name}")
        try:
            with db.inspection() as reads:
                return check(reads)
        except (FermixError, OSError) as exc:
            return _failed(name, exc)

    try:
        with db.inspection() as reads:
            progress(f"checking integrity ({reads.integrity_check_name(full=full)})")
            integrity, problems = check_integrity(reads, full=full, postgres=postgres)
        found: list[str] | None = problems
    except (FermixError, OSError) as exc:
        integrity, found = _failed("integrity", exc), None
    checks = [integrity]
    for table in FTS_TABLES:
        fts = partial(check_fts, table=table, full=full, integrity=found, postgres=postgres)
        checks.append(run(table, fts))
    progress("checking prompt files")
    checks.append(_guarded("prompt files", partial(check_prompt_files, home, db)))
    checks.append(run("review claims", partial(check_claims, now=now)))
    checks.append(run("review gates", partial(check_review_gates, config=config, now=now)))
    checks.append(run("erasures", check_erasures))
    checks.append(run("retention", partial(check_retention, config=config, now=now)))
    checks.append(run("vectors", partial(check_vectors, config=config)))
    return checks


def run_checks(
    home: Home,
    *,
    now: int,
    full: bool = False,
    model_check: bool = False,
    progress: Progress = quiet,
) -> list[Check]:
    """Run every check in order; the database checks only when its schema is current."""
    progress("checking config")
    config_check, config = check_config(home)
    checks = [config_check]
    progress("checking database")
    db_check, db = open_database(home, config)
    checks.append(db_check)
    if db is not None:
        try:
            if db_check.status == "pass":
                checks += database_checks(home, db, config, now=now, full=full, progress=progress)
        finally:
            db.close()
    progress("checking permissions")
    database = not uses_postgres(config)  # memory.db's modes matter only if it holds the memory
    checks.append(_guarded("permissions", partial(check_permissions, home, database=database)))
    progress("checking disk")
    checks.append(_guarded("disk", partial(check_disk, home)))
    if model_check:
        progress("checking model")
        checks.append(check_model(config))
    else:
        hint = "`fermix doctor --model-check` makes one tiny call"
        checks.append(Check("model", "skip", "not checked", hint))
    return checks


def _failed(name: str, exc: Exception) -> Check:
    hint = "the check itself could not run; the error says why"
    return Check(name, "fail", f"{type(exc).__name__}: {exc}", hint)


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    """Run one check; an error it meets becomes its failure, so the other checks still run."""
    try:
        return check()
    except (FermixError, OSError) as exc:
        return _failed(name, exc)


def diagnose(
    home: Home,
    *,
    now: int,
    fix: bool = False,
    full: bool = False,
    model_check: bool = False,
    progress: Progress = quiet,
) -> Report:
    """Check ``home``; with ``fix``, repair what can be repaired and report the state after."""
    checks = run_checks(
        home, now=now, full=full, model_check=model_check and not fix, progress=progress
    )
    if not fix:
        return Report(home.root, checks)
    _, config = check_config(home)
    fixed = apply_fixes(home, config, checks, now=now, progress=progress)
    after = run_checks(home, now=now, full=full, model_check=model_check, progress=progress)
    return Report(home.root, after, fixed)
