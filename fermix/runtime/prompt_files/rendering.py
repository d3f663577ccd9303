"""USER.md and MEMORY.md of one agent and owner, rendered from the rows a session reads now
(C5): the reads of :class:`~fermix.runtime.prompt_files.PromptFiles`' rebuilds, its
in-memory renders while files lag, its staleness checks and ``fermix doctor``."""

from __future__ import annotations

from fermix.core import categories, render
from fermix.core.render import RenderedFiles
from fermix.model import MemoryRow
from fermix.storage import Reads


def load_rows(reads: Reads, agent_id: str, owner_id: str = "") -> list[MemoryRow]:
    """The rows that may render for ``agent_id`` and ``owner_id``: each section's newest.

    Each :func:`~fermix.core.categories.render_queries` filter is read with its section's
    cap as the limit; when rows that show nothing (no ``promote_target``, or a value of
    invisible characters only) crowd the first page, the limit grows until the section is
    full or the rows run out.
    """
    picked: list[MemoryRow] = []
    for query in categories.render_queries(agent_id, owner_id):
        cap = render.file_spec(query.target).cap(query.category)
        limit = cap
        while True:
            rows = reads.rows(**query.filters(), limit=limit)
            fits = [r for r in rows if categories.renders(r, agent_id=agent_id, owner_id=owner_id)]
            shown = sum(1 for r in fits if render.render_value(r.value))
            if shown >= cap or len(rows) < limit:
                break
            limit *= 4
        picked += fits
    return picked


def render_pair(reads: Reads, agent_id: str, owner_id: str) -> RenderedFiles:
    """USER.md and MEMORY.md of ``agent_id`` for ``owner_id``, rendered from the rows now."""
    rows = load_rows(reads, agent_id, owner_id)
    return render.render_files(rows, agent_id=agent_id, owner_id=owner_id)
