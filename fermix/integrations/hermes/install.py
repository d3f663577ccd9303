"""``fermix hermes install``: put the provider where Hermes looks for it (I1).

Hermes finds a user's memory providers in ``$HERMES_HOME/plugins/<name>/``: a folder with
an ``__init__.py`` that defines a ``MemoryProvider`` (or a ``register(ctx)``) and a
``plugin.yaml`` describing it. This writes ``plugins/fermix/`` with both. Its
``__init__.py`` only imports :mod:`fermix.integrations.hermes.provider` from the fermix
installed in Hermes's Python, so upgrading fermix upgrades the provider, and Hermes's
loader (which also runs every other ``*.py`` of the folder) finds nothing else there.

Installing again rewrites the two files (nothing changes when they are current); a
``plugins/fermix`` that this command did not write (no marker line in its
``__init__.py``) is refused unless ``force`` is given, which replaces it. No Hermes import:
this runs wherever fermix is installed.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Final

from fermix.errors import ConflictError, InvalidInputError
from fermix.runtime.prompt_files.disk import make_private_dir, write_atomic

PLUGIN_NAME: Final = "fermix"
MARKER: Final = (
    "# fermix-hermes-plugin: written by `fermix hermes install`; run it again to update."
)
"""The line that marks a plugin folder as this command's."""

INIT_PY: Final = f'''"""fermix's memory provider for Hermes Agent (memory.provider: fermix).

The provider is fermix's own module, fermix.integrations.hermes.provider, imported from
the fermix installed in Hermes's Python: a MemoryProvider whose register(ctx) hands Hermes
a FermixMemoryProvider. Upgrading fermix upgrades it.
"""
{MARKER}
from fermix.integrations.hermes.provider import FermixMemoryProvider, register

__all__ = ["FermixMemoryProvider", "register"]
'''


def plugin_yaml() -> str:
    """The plugin's ``plugin.yaml``: its name, fermix's version, what it is, what it needs."""
    try:
        version = metadata.version("fermix")
    except metadata.PackageNotFoundError:
        version = "0"
    return (
        f"name: {PLUGIN_NAME}\n"
        f'version: "{version}"\n'
        'description: "fermix: durable conversation memory (SQLite or PostgreSQL), USER.md and '
        "MEMORY.md kept by a background reviewer, hybrid recall and memory tools; embedded or "
        'against a fermix memory server."\n'
        "pip_dependencies:\n"
        "  - fermix\n"
    )


@dataclass(frozen=True)
class Installed:
    """What :func:`install` did: where the plugin is, and whether anything changed."""

    folder: Path
    hermes_home: Path
    changed: bool
    """False when the folder already held these exact files."""
    replaced_foreign: bool = False
    """True when ``force`` replaced a folder this command had not written."""


def default_hermes_home(environ: Mapping[str, str] = os.environ) -> Path:
    """``HERMES_HOME`` as Hermes resolves it (``hermes_constants.get_hermes_home``): the
    ``HERMES_HOME`` variable, else ``%LOCALAPPDATA%\\hermes`` on Windows, else ``~/.hermes``."""
    chosen = environ.get("HERMES_HOME", "").strip()
    if chosen:
        return Path(chosen).expanduser()
    if sys.platform == "win32":
        local = environ.get("LOCALAPPDATA", "").strip()
        return (Path(local) if local else Path.home() / "AppData" / "Local") / "hermes"
    return Path.home() / ".hermes"


def is_ours(folder: Path) -> bool:
    """Whether ``folder`` is a plugin folder this command wrote (its marker line)."""
    init = folder / "__init__.py"
    try:
        return folder.is_dir() and not folder.is_symlink() and MARKER in init.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def install(hermes_home: str | os.PathLike[str] | None = None, *, force: bool = False) -> Installed:
    """Write ``plugins/fermix/`` in ``hermes_home`` (default: :func:`default_hermes_home`).

    A folder of that name this command did not write is a :class:`ConflictError` naming
    it, and nothing changes, unless ``force``; an empty ``hermes_home`` is an
    :class:`InvalidInputError`.
    """
    if hermes_home is not None and not os.fspath(hermes_home).strip():
        raise InvalidInputError("--hermes-home must not be empty")
    root = Path(hermes_home).expanduser() if hermes_home is not None else default_hermes_home()
    root = root.absolute()
    folder = root / "plugins" / PLUGIN_NAME
    files = {"__init__.py": INIT_PY, "plugin.yaml": plugin_yaml()}
    foreign = (folder.exists() or folder.is_symlink()) and not is_ours(folder)
    if foreign and not force:
        raise ConflictError(
            f"{folder} exists and was not written by fermix hermes install; --force replaces it"
        )
    if foreign:
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
        else:
            folder.unlink()
    # Hermes's loader runs every *.py of the folder as part of the plugin: none but ours.
    stale = [] if foreign else [p for p in folder.glob("*.py") if p.name not in files]
    current = all(_reads(folder / name) == text for name, text in files.items())
    if not foreign and not stale and current:
        return Installed(folder, root, changed=False)
    make_private_dir(folder)
    for name, text in files.items():
        write_atomic(folder / name, text)
    for path in stale:
        path.unlink()
    return Installed(folder, root, changed=True, replaced_foreign=foreign)


def _reads(path: Path) -> str | None:
    try:
        return path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
