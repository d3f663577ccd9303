"""The checks of ``fermix doctor`` (:mod:`fermix.cli.doctor`), and the repairs that are safe
to make (S1, S2, S4, S5, C5, E2, P2, M10).

Each check reads and returns a :class:`~.outcome.Check`: a status, a one-line summary, a
hint saying what to do, and the :data:`~.outcome.Fix` that repairs it when one can. The
checks look at the store ``[fermix_core.storage]`` chooses (``memory.db``, or a PostgreSQL
database, B1) through :func:`~fermix.storage.inspect_storage`, which neither creates,
migrates nor writes it; only :func:`~.fixes.apply_fixes` (``--fix``) opens it to write.
Only derived state is ever repaired: an FTS mirror is rebuilt from its content table, a
prompt file rendered again from its rows
(:meth:`PromptFiles.repair <fermix.runtime.prompt_files.PromptFiles.repair>`, which keeps
an operator's rollback, P2), an expired review claim released (any reviewer would take it
over), pending migrations applied (as any command does at start); besides, a path of the
home open to other accounts is made owner-only (M10).
``memory.db`` is never rewritten, and litellm is imported only by
:func:`~.environment.check_model`.

The database checks run quick by default and in full with ``full=True`` (``doctor
--full``): see :mod:`fermix.storage.sqlite.health` for what each depth reads.

The modules, one concept each:

- :mod:`.outcome`: what a check found (``Check``) and what the doctor found (``Report``);
- :mod:`.diagnosis`: running every check in order, and :func:`~.diagnosis.diagnose`
  (check; with ``fix``, repair and check again);
- :mod:`.environment`: config.toml, disk space, the model route;
- :mod:`.database`: opening and migrations, integrity, the FTS mirrors;
- :mod:`.prompt_files`: USER.md and MEMORY.md against their rows;
- :mod:`.reviews`: review claims and the reviewer's gates;
- :mod:`.permissions`: the home and its data are owner-only (M10), and ``chmod go-rwx``
  (``memory.db`` only when it holds the memory; the prompt files always, a local cache
  on PostgreSQL);
- :mod:`.vectors`: the vectors of recall: coverage, and a model mismatch (Q2);
- :mod:`.fixes`: the repairs (``--fix``), the only module that writes.
"""
