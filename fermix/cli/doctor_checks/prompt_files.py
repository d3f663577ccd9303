"""The prompt files' check: every USER.md and MEMORY.md is what its rows (or an operator's
rollback) make it (S1, C5, P2)."""

from __future__ import annotations

from typing import Any

from fermix.cli.doctor_checks.outcome import Check
from fermix.core import render
from fermix.home import Home
from fermix.runtime.prompt_files import PromptFiles, disk, render_pair
from fermix.storage import Reads, Storage


def stale_prompt_files(home: Home, db: Storage) -> tuple[int, int, list[dict[str, Any]]]:
    """How many prompt files were compared, how many hold a rollback, and those that lag
    their rows (C5, P2).

    The pairs come from :meth:`PromptFiles.stale`, the one staleness rule
    (:func:`~fermix.core.render.file_lags`): a file holding a rolled-back current revision
    is the operator's choice, not stale. Each file of a stale pair is named with its state.
    """
    stale = set(PromptFiles(home, db).stale())
    compared = rolled_back = 0
    found: list[dict[str, Any]] = []
    with db.read() as reads:
        for agent_id in reads.memory_agents():
            for owner_id in reads.memory_owners(agent_id):
                if not disk.has_files(agent_id, owner_id):
                    continue  # ids that cannot name a folder have no prompt files
                compared += len(render.FILES)
                if (agent_id, owner_id) in stale:
                    found += _stale_files(home, reads, agent_id, owner_id)
                    continue
                for spec in render.FILES:
                    current = reads.current_revision(agent_id, spec.name, owner_id=owner_id)
                    rolled_back += current is not None and current.reason.startswith("rollback:")
    return compared, rolled_back, found


def _stale_files(home: Home, reads: Reads, agent_id: str, owner_id: str) -> list[dict[str, Any]]:
    """The files of one stale pair that lag, each with its state."""
    folder = disk.prompt_dir(home, agent_id, owner_id)
    found = []
    rendered = render_pair(reads, agent_id, owner_id)
    for spec, text in zip(render.FILES, rendered, strict=True):
        path = folder / spec.filename
        current = reads.current_revision(agent_id, spec.name, owner_id=owner_id)
        on_disk = disk.read_bytes(path)
        if not render.file_lags(text, current, on_disk):
            continue
        if on_disk is None:
            state = "missing"
        elif current is not None and current.content.encode("utf-8") == on_disk:
            state = "its current revision lags its rows"
        else:
            state = "differs from its rows"
        found.append(
            {"agent_id": agent_id, "owner_id": owner_id, "file": str(path), "state": state}
        )
    return found


def check_prompt_files(home: Home, db: Storage) -> Check:
    """Every USER.md and MEMORY.md is what its rows (or its rollback) make it (S1, C5, P2)."""
    compared, rolled_back, stale = stale_prompt_files(home, db)
    if not stale:
        summary = f"{compared} prompt file(s) match their rows"
        if rolled_back:
            summary += f" ({rolled_back} rolled back, kept until the next rebuild)"
        return Check("prompt files", "pass", summary)
    summary = f"{len(stale)} of {compared} prompt file(s) differ from a fresh render of their rows"
    hint = (
        "the files are derived from memory.db; `fermix doctor --fix` renders them again"
        " (a hand edit is lost: store lasting facts as memory rows instead)"
    )
    return Check("prompt files", "fail", summary, hint, "prompt_files", stale)
