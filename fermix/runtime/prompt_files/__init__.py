"""Prompt files: USER.md and MEMORY.md of each agent and owner, derived from the memory rows
(C5, P1, P2, M6).

:class:`PromptFiles` is what the runtime holds: its rebuilds run on the writer's side (after
a memory write, through the process's one writer, :mod:`.rebuilding`) and its reads are pure
(a compose never commits, fsyncs or writes a file). The concepts it is made of:

- :mod:`.rendering`: both files rendered from the rows a session reads now;
- :mod:`.disk`: where the files live, their atomic replacement, their read cache and the
  per-(agent, owner) lock that holds across processes;
- :mod:`.deferred`: the rebuilds queued for a background thread (other owners' after a shared
  row, M6) and the marker that tells other processes;
- :mod:`.shared_store`: on a shared store (PostgreSQL, B2) the stored revisions are the files
  and those on disk a cache.
"""

from fermix.runtime.prompt_files.rebuilding import FileResult, PromptFiles, RebuildResult
from fermix.runtime.prompt_files.rendering import load_rows, render_pair

__all__ = ["FileResult", "PromptFiles", "RebuildResult", "load_rows", "render_pair"]
