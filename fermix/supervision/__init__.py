"""The supervision layer's parts below :class:`fermix.supervisor.Supervisor` (A6).

``restarts`` is the restart policy (restart types, strategies, intensity) and its pure
rules; ``loop`` is a supervisor's own thread and how it ends. The supervisor, its child
specs and its reports stay in ``fermix/supervisor.py``; the actors it watches report their
exits from ``fermix/actors/base.py``.
"""
