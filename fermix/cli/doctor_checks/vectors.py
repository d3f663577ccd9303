"""The vectors of recall (Q2): how many rows have one, and whether they are of the
configured model."""

from __future__ import annotations

from fermix.cli.doctor_checks.outcome import Check
from fermix.config import Config
from fermix.storage import Reads

NAME = "vectors"


def configured_model(config: Config) -> str:
    """The name the configured embedding model records beside its vectors."""
    model = config.embedding.model
    from fermix.embedding import WORDLLAMA, WordLlamaEmbedder  # numpy: only when a check runs

    return WordLlamaEmbedder.name if model == WORDLLAMA else f"litellm/{model}"


def check_vectors(reads: Reads, config: Config) -> Check:
    """Vector coverage of messages and live memory rows, and a model mismatch (Q2)."""
    if not config.embedding.enabled:
        hint = "recall is full-text only; [fermix_core.embedding] enabled = true turns vectors on"
        return Check(NAME, "skip", "embedding is off", hint)
    found = reads.vector_coverage()
    configured = configured_model(config)
    total = found.messages + found.memories
    done = found.message_vectors + found.memory_vectors
    details = [
        {
            "configured_model": configured,
            "recorded_model": found.model,
            "dim": found.dim,
            "messages": found.messages,
            "message_vectors": found.message_vectors,
            "memory_rows": found.memories,
            "memory_row_vectors": found.memory_vectors,
        }
    ]
    if found.model is not None and found.model != configured:
        summary = f"the vectors are of {found.model}, the configured model is {configured}"
        hint = (
            "a host started with this config embeds everything again in the background;"
            " `fermix index rebuild` does it now. Until then recall is full-text only"
        )
        return Check(NAME, "warn", summary, hint, details=details)
    share = f"{done} of {total} rows have a vector" + (
        f" ({100 * done / total:.1f} %)" if total else ""
    )
    if done < total:
        hint = (
            "a running host embeds them in the background (rows without one are still found"
            " by full-text search); `fermix index rebuild --missing` embeds them now"
        )
        return Check(NAME, "info", f"{share}, {configured}", hint, details=details)
    return Check(NAME, "pass", f"{share}, {configured}", details=details)
