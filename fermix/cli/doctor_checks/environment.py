"""What the home runs with: config.toml (and whether it names a model: without one, reviews
and compaction are off), free disk space, and the model route (the only check that imports
litellm, and only when asked)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from fermix.cli.doctor_checks.outcome import Check
from fermix.config import Config, load_config
from fermix.errors import ConfigError, FermixError
from fermix.home import Home

LOW_DISK_BYTES = 1 << 30
LOW_DISK_FRACTION = 0.05
TINY_PROMPT = ({"role": "user", "content": "Say OK."},)
"""The one message of a route test: it costs a handful of tokens."""
NO_MODEL = "no model is configured: reviews and compaction are off"
NO_MODEL_HINT = (
    "set one: `fermix setup`, or `fermix config set fermix_core.model.primary MODEL` (a litellm"
    ' model name such as openai/gpt-4o-mini); a host that passes Memory(model="...") in code'
    " has one anyway"
)


def check_config(home: Home) -> tuple[Check, Config]:
    """config.toml loads, and names a model (else reviews and compaction are off, M8: info,
    since a host may pass its model in code); on failure the checks go on with every
    default."""
    path = home.config_path
    try:
        config = load_config(path)
    except ConfigError as exc:
        hint = "fix it with `fermix config set KEY VALUE` or by hand (`fermix config path`)"
        return Check("config", "fail", str(exc), hint), Config()
    loaded = f"{path.name} loads" if path.exists() else "no config.toml: every default"
    if config.model.primary is None:
        return Check("config", "info", f"{loaded}; {NO_MODEL}", NO_MODEL_HINT), config
    return Check("config", "pass", loaded), config  # a model means a config.toml


def check_disk(home: Home, usage: Callable[[str], Any] = shutil.disk_usage) -> Check:
    """Free space on the home's file system: warn under 1 GiB or 5 %."""
    where = home.root
    while not where.exists() and where != where.parent:
        where = where.parent
    total, _used, free = usage(str(where))[:3]
    shown = f"{free / (1 << 30):.1f} GiB free ({free / total:.0%} of {total / (1 << 30):.1f} GiB)"
    if free < LOW_DISK_BYTES or free < LOW_DISK_FRACTION * total:
        hint = "SQLite needs room for its WAL and for checkpoints; free some space"
        return Check("disk", "warn", shown, hint)
    return Check("disk", "pass", shown)


def check_model(config: Config) -> Check:
    """One tiny call through the configured route (imports litellm)."""
    from fermix import llm

    route = llm.Route.from_config(config.model)
    if route.primary is None:
        return Check("model", "warn", NO_MODEL, NO_MODEL_HINT)
    try:
        answer = llm.complete(route, TINY_PROMPT, agent="doctor", max_tokens=5)
    except FermixError as exc:
        hint = "check the model names, api_base and api_key_env (`fermix config show`)"
        return Check("model", "fail", str(exc), hint)
    summary = f"{answer.model} answered in {answer.latency_ms:.0f} ms"
    if answer.tried:
        summary += f", after {len(answer.tried)} failed attempt(s)"
    return Check("model", "pass", summary)
