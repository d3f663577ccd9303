"""The private runtime both facades share: it orders and owns every write.

:mod:`~fermix.runtime.engine` wires one process together; :mod:`~fermix.runtime.writer`
is the one write path; :mod:`~fermix.runtime.prompt_files` rebuilds USER.md and MEMORY.md
through it; :mod:`~fermix.runtime.registry` finds and passivates conversation actors;
:mod:`~fermix.runtime.reviewing`, :mod:`~fermix.runtime.compacting` and
:mod:`~fermix.runtime.recall` are the use cases the actors and the tools run.
"""
