"""``fermix config show | get | set | unset | path``: config.toml for operators (E8, K2).

Keys are dotted (``fermix_core.memory.review_interval_hours``). A value on the command line
is read as a TOML literal (``24``, ``true``, ``["a", "b"]``), else as text, and checked
exactly as loading the file checks it; a bad value or an unknown key exits 2 naming the
key, and the file is not touched. The file is edited in place
(:mod:`fermix.cli.config_file`), so the comments and layout of a hand-edited file
survive, and it is replaced atomically.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from tomlkit import TOMLDocument

from fermix.cli.config_file import (
    check_document,
    defaults_toml,
    document_values,
    parse_document,
    read_document,
    set_document_value,
    toml_literal,
    unset_document_value,
    write_document,
)
from fermix.cli.context import CommandContext
from fermix.cli.output import console, print_json, table
from fermix.config import KEYS, Config, load_config, parse_value, validate_key
from fermix.errors import ConfigError, InvalidInputError

API_KEY_ENV = "fermix_core.model.api_key_env"
_SECRET_PREFIXES = ("sk-", "sk_", "pk-", "pk_", "xai-", "gsk_", "ghp_", "hf_", "AIza", "r8_")
_RANDOM_RUN = re.compile(r"[A-Za-z0-9]{20,}")


def looks_like_secret(text: str) -> bool:
    """Whether ``text`` looks like an API key rather than the name of a variable holding one.

    A known key prefix (``sk-``, ``AIza``...), or a run of 20 or more letters and digits
    mixing both, as random tokens do and variable names (``OPENAI_API_KEY``) do not.
    """
    if text.startswith(_SECRET_PREFIXES):
        return True
    return any(
        any(c.isdigit() for c in run) and any(c.isalpha() for c in run)
        for run in _RANDOM_RUN.findall(text)
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``config`` command group."""
    group = sub.add_parser(
        "config",
        help="show and change config.toml, keeping its comments",
        description="Read and edit config.toml one dotted key at a time"
        " (fermix_core.memory.review_interval_hours); values are checked as at load.",
    )
    cmds = group.add_subparsers(dest="config_command", required=True, metavar="COMMAND")

    p = cmds.add_parser("show", help="every key's effective value, marking those set in the file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_show)

    p = cmds.add_parser("get", help="one key's effective value")
    p.add_argument(
        "key", metavar="KEY", help="dotted key, e.g. fermix_core.memory.review_max_messages"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_get)

    p = cmds.add_parser("set", help="set one key in config.toml, checked as at load")
    p.add_argument("key", metavar="KEY", help="dotted key")
    p.add_argument("value", metavar="VALUE", help='a TOML literal (24, true, ["a"]) or text')
    p.set_defaults(handler=cmd_set)

    p = cmds.add_parser("unset", help="remove one key from config.toml (back to its default)")
    p.add_argument("key", metavar="KEY", help="dotted key")
    p.set_defaults(handler=cmd_unset)

    p = cmds.add_parser("path", help="print where config.toml is (whether or not it exists)")
    p.set_defaults(handler=cmd_path)


def usage_error(exc: ConfigError) -> InvalidInputError:
    """A refused value or key as bad input (exit 2), keeping the message that names the key."""
    return InvalidInputError(str(exc))


def known_key(dotted: str) -> str:
    """``dotted`` if it names a key; else :class:`InvalidInputError` with the nearest name."""
    if dotted not in KEYS:
        try:
            validate_key(dotted, None)  # raises the unknown-key error, with a suggestion
        except ConfigError as exc:
            raise usage_error(exc) from None
    return dotted


def checked_value(dotted: str, value: object) -> object:
    """``value`` for ``dotted`` if it loads; else :class:`InvalidInputError` naming the key.

    Beyond the load-time rule, an ``api_key_env`` that looks like a key itself is refused
    (and not echoed): the file must name the variable, never hold the secret.
    """
    try:
        held = validate_key(dotted, value)
    except ConfigError as exc:
        raise usage_error(exc) from None
    if dotted == API_KEY_ENV and isinstance(value, str) and looks_like_secret(value):
        raise InvalidInputError(
            f"{dotted} looks like an API key itself (value not shown); give the NAME of the"
            " environment variable that holds it, such as OPENAI_API_KEY"
        )
    return held


def effective(config: Config, dotted: str) -> object:
    """The value ``config`` holds for ``dotted`` (the default when the file does not set it)."""
    _, section, name = dotted.split(".")
    return getattr(getattr(config, section), name)


def _plain(value: object) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _state(ctx: CommandContext) -> tuple[Config, dict[str, object]]:
    """The loaded config and the keys the file sets; a bad file raises naming the key."""
    path = ctx.home.config_path
    return load_config(path), document_values(read_document(path))


def _entry(config: Config, in_file: dict[str, object], dotted: str) -> dict[str, Any]:
    key = KEYS[dotted]
    return {
        "key": dotted,
        "value": _plain(effective(config, dotted)),
        "default": _plain(key.default),
        "set_in_file": dotted in in_file,
        "accepts": key.kind,
        "doc": key.doc,
    }


def _as_toml(value: object) -> str:
    return "(unset)" if value is None else toml_literal(value)


def cmd_show(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix config show``: every key, its effective value, and whether the file sets it."""
    config, in_file = _state(ctx)
    entries = [_entry(config, in_file, dotted) for dotted in KEYS]
    path = ctx.home.config_path
    if args.json:
        print_json({"path": str(path), "exists": path.exists(), "keys": entries})
        return 0
    out = console()
    note = "" if path.exists() else " (no file: every value is the default)"
    out.print(f"{path}{note}", markup=False)
    rows = [
        (
            e["key"],
            _as_toml(effective(config, e["key"])),
            "config.toml" if e["set_in_file"] else "default",
        )
        for e in entries
    ]
    out.print(table("config", ["key", "value", "from"], rows))
    return 0


def cmd_get(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix config get KEY``: text as is, other values as TOML literals, unset as nothing."""
    known_key(args.key)
    config, in_file = _state(ctx)
    if args.json:
        print_json(_entry(config, in_file, args.key))
        return 0
    value = effective(config, args.key)
    if isinstance(value, str):
        print(value)
    elif value is not None:
        print(toml_literal(value))
    return 0


def cmd_set(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix config set KEY VALUE``: change one key in place; the rest of the file stays."""
    value = parse_value(args.value)
    checked_value(args.key, value)
    path = ctx.home.config_path
    if path.exists():
        document = read_document(path)
        set_document_value(document, args.key, value)
    else:  # a new file lists every key, this one uncommented in its place
        document = parse_document(defaults_toml({args.key: value}))
    write_document(path, document)
    console().print(f"{args.key} = {toml_literal(value)}  ({path})", markup=False)
    return _still_loads(document, path)


def cmd_unset(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix config unset KEY``: drop the key from the file, so its default applies."""
    known_key(args.key)
    path = ctx.home.config_path
    document = read_document(path)
    if not unset_document_value(document, args.key):
        console().print(f"{args.key} is not set in {path}; it is at its default", markup=False)
        return 0
    write_document(path, document)
    default = KEYS[args.key].default
    console().print(f"{args.key} unset; its default {_as_toml(default)} applies", markup=False)
    return _still_loads(document, path)


def _still_loads(document: TOMLDocument, path: Path) -> int:
    """Exit 1, saying why, when another key of the written file still does not load."""
    try:
        check_document(document, str(path))
    except ConfigError as exc:
        print(f"fermix: written, but the file still does not load: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_path(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix config path``."""
    print(ctx.home.config_path)
    return 0
