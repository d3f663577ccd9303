"""The private runtime both facades share: it orders and owns every write.

:mod:`~fermix.runtime.composition` is the one composition root: it builds every service of
a process from a home and a config, for :mod:`~fermix.runtime.engine` (the ``Runtime`` the
facades call), the CLI and the tests; :mod:`~fermix.runtime.pool`
(requests to the pooled Reviewers and Compactors), :mod:`~fermix.runtime.timer` (the
periodic sweep and passivation), :mod:`~fermix.runtime.windows` (what conversation actors
read); :mod:`~fermix.runtime.writer` is the one write path;
:mod:`~fermix.runtime.prompt_files` holds the prompt files, USER.md and MEMORY.md,
rebuilt through it (other owners' on a background thread) and read purely;
:mod:`~fermix.runtime.registry` finds and passivates conversation actors;
:mod:`~fermix.runtime.reviewing` (with ``review_inputs`` and ``review_apply``),
:mod:`~fermix.runtime.compacting`, :mod:`~fermix.runtime.recall` and
:mod:`~fermix.runtime.jobs` are the use cases the actors, the tools and the facades run.
"""
