"""Editing ``config.toml`` in place, for ``fermix config`` and ``fermix setup`` (E8).

Only the CLI writes the file, so only the CLI imports tomlkit: hosts load the config with
:func:`fermix.config.load_config` (tomllib) and never pay for it. The file is read as a
tomlkit document that keeps its comments and layout, edited one dotted key at a time (each
value checked with :func:`fermix.config.validate_key` first), and replaced atomically. A new
file starts from :func:`defaults_toml`, every key commented out at its default.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import ParseError
from tomlkit.items import Item

from fermix.config import KEYS, ROOT_TABLE, SECTIONS, Config, parse_config, validate_key
from fermix.errors import ConfigError


def toml_literal(value: object) -> str:
    """``value`` as it would be written in config.toml (``true``, ``24.0``, ``["a"]``)."""
    return str(tomlkit.item(list(value) if isinstance(value, tuple) else value).as_string())


def defaults_toml(values: Mapping[str, object] | None = None) -> str:
    """Render a ``config.toml`` with every key commented out at its default.

    A key that is unset by default is shown at an example value instead. A key in
    ``values`` (dotted name to TOML value) is written uncommented at that value, in place.
    """
    chosen = values or {}
    lines = [
        "# fermix configuration. Every key is shown commented out at its default (or, if it",
        "# is unset by default, at an example value); uncomment a line to change it.",
    ]
    for section, cls in SECTIONS.items():
        lines += ["", f"[{ROOT_TABLE}.{section}]"]
        for f in fields(cls):
            key = KEYS[f"{ROOT_TABLE}.{section}.{f.name}"]
            mark = "" if key.dotted in chosen else "# "
            shown = chosen.get(key.dotted, key.example if key.default is None else key.default)
            lines += [f"# {key.doc} Must be {key.kind}.", f"{mark}{f.name} = {toml_literal(shown)}"]
    return "\n".join(lines) + "\n"


def read_document(path: str | os.PathLike[str]) -> tomlkit.TOMLDocument:
    """``config.toml`` as a tomlkit document that keeps its comments and layout.

    A missing file is an empty document; unreadable TOML raises :class:`ConfigError`.
    """
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as fh:
            return tomlkit.parse(fh.read())
    except FileNotFoundError:
        return tomlkit.document()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read config: {exc}") from None
    except ParseError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None


def parse_document(text: str) -> tomlkit.TOMLDocument:
    """``text`` (such as :func:`defaults_toml` renders) as a tomlkit document."""
    return tomlkit.parse(text)


def document_values(document: tomlkit.TOMLDocument) -> dict[str, object]:
    """Every known key set in ``document``, by dotted name, as plain TOML values."""
    root = document.unwrap().get(ROOT_TABLE)
    tables = root.items() if isinstance(root, dict) else ()
    return {
        f"{ROOT_TABLE}.{section}.{name}": value
        for section, table in tables
        if isinstance(table, dict)
        for name, value in table.items()
        if f"{ROOT_TABLE}.{section}.{name}" in KEYS
    }


def _section_table(document: tomlkit.TOMLDocument, dotted: str, *, create: bool) -> Any:
    """The table of ``dotted``'s section in ``document`` (created when asked), else None."""
    _, section, _ = dotted.split(".")
    tables: Any = document
    path = ""
    for name in (ROOT_TABLE, section):
        path = f"{path}.{name}" if path else name
        if name not in tables:
            if not create:
                return None
            tables.add(name, tomlkit.table(is_super_table=name == ROOT_TABLE))
        tables = tables[name]
        if not isinstance(tables, dict):
            shown = tables.as_string() if isinstance(tables, Item) else repr(tables)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise ConfigError(f"{path} must be a table, not {shown}")
    return tables


def set_document_value(document: tomlkit.TOMLDocument, dotted: str, value: object) -> None:
    """Set ``dotted`` to ``value`` in ``document``, keeping every other line and comment.

    ``value`` is checked with :func:`validate_key` first (:class:`ConfigError` names the key)
    and stored as given: ``24`` stays an integer, ``"infinity"`` stays text.
    """
    validate_key(dotted, value)
    stored = list(value) if isinstance(value, tuple) else value
    _section_table(document, dotted, create=True)[dotted.rsplit(".", 1)[1]] = stored


def unset_document_value(document: tomlkit.TOMLDocument, dotted: str) -> bool:
    """Remove ``dotted`` from ``document`` (back to its default); False if it was not set."""
    if dotted not in KEYS:
        validate_key(dotted, None)  # raises the unknown-key error, naming the nearest key
    table = _section_table(document, dotted, create=False)
    name = dotted.rsplit(".", 1)[1]
    if table is None or name not in table:
        return False
    del table[name]
    return True


def check_document(document: tomlkit.TOMLDocument, source: str) -> Config:
    """Load ``document`` exactly as :func:`fermix.config.load_config` would load ``source``."""
    return parse_config(document.as_string(), source)


def write_document(path: Path, document: tomlkit.TOMLDocument) -> None:
    """Replace ``path`` with ``document`` atomically (temp, fsync, rename), keeping its mode.

    A new file is owner-only, 0600 whatever the umask, in a 0700 home if the home is new
    (M10); an existing file keeps its mode (a looser one is for ``fermix doctor`` to name).
    """
    from fermix.runtime.prompt_files.disk import write_atomic

    try:
        mode: int | None = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None  # write_atomic's file is exactly 0600
    write_atomic(path, document.as_string())
    if mode is not None:
        os.chmod(path, mode)
