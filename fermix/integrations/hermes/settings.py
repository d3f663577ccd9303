"""The provider's settings: ``$HERMES_HOME/fermix.json`` and ``FERMIX_TOKEN`` (I1).

Hermes asks a provider for its config fields (:func:`config_schema`, shown by ``hermes
memory setup``) and hands the answers that are not secret to ``save_config``, which
writes them here (:func:`save`); a secret field goes to ``$HERMES_HOME/.env`` instead,
which Hermes loads into the environment at start. So the server's token is read from
``FERMIX_TOKEN`` first, and from the file only when a caller saved it there itself.
Either way the file is written owner-only (0600, atomically), and the token is never in a
``repr`` or a log line.

Two modes: ``embedded`` opens a fermix home in Hermes's own process (``fermix.Memory``),
``server`` talks to a memory server (``fermix.Client``). Trust is not a setting: fermix
decides it as for any host (a guest unless ``[fermix_core.security] operators`` names the
owner, or, against a server, as its token allows), so nothing here can make every speaker
an operator.

No Hermes import: the settings load in any environment, the CLI's included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from fermix import validate
from fermix.errors import ConfigError, InvalidInputError
from fermix.home import Home
from fermix.runtime.prompt_files.disk import write_atomic

CONFIG_FILE: Final = "fermix.json"
"""The settings file's name in ``$HERMES_HOME``."""
TOKEN_ENV: Final = "FERMIX_TOKEN"
"""The environment variable holding the memory server's token (``hermes memory setup``
writes it to ``$HERMES_HOME/.env``)."""
MODES: Final = ("embedded", "server")
DEFAULT_AGENT: Final = "hermes"
KEYS: Final = ("mode", "home", "url", "token", "agent_id", "owner_id", "model", "api_base")


@dataclass(frozen=True)
class Settings:
    """What the provider runs with; :func:`load` makes one from the file and environment.

    ``home`` empty is fermix's own default (``$FERMIX_HOME``, else ``~/.fermix``);
    ``owner_id`` is the owner when Hermes names no user (its CLI), empty being the
    agent's own; ``model`` and ``api_base``, when given, are the litellm route of fermix's
    reviewer and compactor in embedded mode (else the home's ``config.toml`` decides).
    """

    mode: str = "embedded"
    home: str = ""
    url: str = ""
    token: str = field(default="", repr=False)
    agent_id: str = DEFAULT_AGENT
    owner_id: str = ""
    model: str = ""
    api_base: str = ""

    @property
    def embedded(self) -> bool:
        """Whether fermix runs in Hermes's process (else against a server)."""
        return self.mode == "embedded"

    @property
    def ready(self) -> bool:
        """Whether the settings are complete: a server needs its URL and a token."""
        return self.embedded or bool(self.url and self.token)

    def fermix_home(self) -> Home:
        """The fermix home of embedded mode, resolved as fermix resolves it."""
        return Home.resolve(self.home or None)


def path_in(hermes_home: str | os.PathLike[str]) -> Path:
    """Where the settings file of ``hermes_home`` is."""
    return Path(hermes_home) / CONFIG_FILE


def load(hermes_home: str | os.PathLike[str], environ: Mapping[str, str] = os.environ) -> Settings:
    """The settings of ``hermes_home``: its ``fermix.json`` (none is all defaults), with
    ``FERMIX_TOKEN`` over the file's token. A bad file is a :class:`ConfigError`."""
    values = _read(path_in(hermes_home))
    settings = _checked(values, source=str(path_in(hermes_home)))
    token = environ.get(TOKEN_ENV, "")
    return replace(settings, token=token) if token else settings


def save(values: Mapping[str, Any], hermes_home: str | os.PathLike[str]) -> Path:
    """Merge ``values`` into ``hermes_home``'s ``fermix.json`` and write it, 0600.

    Values are checked first (a bad one is an :class:`InvalidInputError` naming it, and
    nothing is written); empty strings are kept, so a field can be cleared.
    """
    target = path_in(hermes_home)
    merged = {**_read(target), **{str(k): v for k, v in values.items()}}
    _checked(merged, source="the values given")
    write_atomic(target, json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return target


def config_schema() -> list[dict[str, Any]]:
    """The fields ``hermes memory setup`` asks for, in Hermes's format (``when`` shows a
    field only in its mode; the token is a secret, kept in ``.env``)."""
    embedded = {"mode": "embedded"}
    server = {"mode": "server"}
    return [
        {
            "key": "mode",
            "description": "Run fermix in Hermes's process (embedded) or use a memory server",
            "default": "embedded",
            "choices": list(MODES),
        },
        {
            "key": "home",
            "description": "fermix home directory (blank: $FERMIX_HOME, else ~/.fermix)",
            "when": embedded,
        },
        {
            "key": "model",
            "description": "litellm model of fermix's reviewer (blank: the home's config.toml)",
            "when": embedded,
        },
        {
            "key": "url",
            "description": "Memory server URL (fermix server start prints it)",
            "required": True,
            "when": server,
        },
        {
            "key": "token",
            "description": "Memory server token (fermix token create --agent AGENT)",
            "secret": True,
            "required": True,
            "env_var": TOKEN_ENV,
            "when": server,
        },
        {"key": "agent_id", "description": "fermix agent id", "default": DEFAULT_AGENT},
        {
            "key": "owner_id",
            "description": "Owner of CLI sessions (gateways name their users; blank: the agent's)",
        },
    ]


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _checked(values: Mapping[str, Any], *, source: str) -> Settings:
    """The settings ``values`` spell, or a typed error naming the key and ``source``."""
    unknown = sorted(set(values) - set(KEYS))
    error = ConfigError if source.endswith(CONFIG_FILE) else InvalidInputError
    if unknown:
        raise error(f"{source}: unknown key {unknown[0]!r} (keys: {', '.join(KEYS)})")
    for key, value in values.items():
        if not isinstance(value, str):
            raise error(f"{source}: {key} must be a string, not {type(value).__name__}")
    mode = values.get("mode") or "embedded"
    if mode not in MODES:
        raise error(f"{source}: mode must be one of {', '.join(MODES)}, not {mode!r}")
    try:
        for key in ("agent_id", "owner_id"):
            validate.identifier(key, values.get(key, ""), allow_empty=True)
        for key in ("home", "url", "token", "model", "api_base"):
            validate.text(key, values.get(key, ""), max_chars=4096)
    except InvalidInputError as exc:
        raise error(f"{source}: {exc}") from None
    url = values.get("url", "")
    if url and not url.startswith(("http://", "https://", "http+unix://")):
        raise error(f"{source}: url must start with http://, https:// or http+unix://")
    return Settings(
        mode=mode,
        home=values.get("home", ""),
        url=url.rstrip("/"),
        token=values.get("token", ""),
        agent_id=values.get("agent_id") or DEFAULT_AGENT,
        owner_id=values.get("owner_id", ""),
        model=values.get("model", ""),
        api_base=values.get("api_base", ""),
    )
