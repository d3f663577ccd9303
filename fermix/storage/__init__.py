"""Storage: the source of truth (S1-S8), behind one port (B1).

The layers above open the store with :func:`open_storage` (SQLite in the home, or
PostgreSQL when a URL is set; :func:`inspect_storage` to look without changing it) and use
the :class:`Storage` port and its sessions only (:mod:`fermix.storage.port`): read units on
pooled read connections, write units through one group-commit writer. The adapters,
:mod:`fermix.storage.sqlite` and :mod:`fermix.storage.postgres`, are siblings that nothing
above this package imports.
"""

from fermix.storage.opening import inspect_storage, open_file, open_storage
from fermix.storage.port import Inspection, Reads, Repair, Storage, Writes

__all__ = [
    "Inspection",
    "Reads",
    "Repair",
    "Storage",
    "Writes",
    "inspect_storage",
    "open_file",
    "open_storage",
]
