"""What a doctor check found (:class:`Check`) and what the doctor found (:class:`Report`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["pass", "info", "warn", "fail", "skip"]
Fix = Literal["migrate", "fts", "prompt_files", "claims", "erasures", "permissions"]
"""What :func:`~fermix.cli.doctor_checks.fixes.apply_fixes` can do: migrate, rebuild an FTS
mirror, re-render, release, make owner-only."""
Progress = Callable[[str], None]
"""Told what runs next (``checking integrity (quick_check)``), to show it to a person."""


def quiet(name: str) -> None:
    """A :data:`Progress` that shows nothing."""


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
