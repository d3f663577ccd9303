"""mem0's side of bench/peers.py, run by it in mem0's own venv (``bin/venv-mem0``).

A helper module (its name starts with ``_``): bench/run.py does not run it. Usage:
``python bench/_peers_mem0.py --data PATH --workdir DIR --model-url URL [--quick]
[--ingest-only VARIANT]``.

It prints one JSON object per line on stdout, each with a ``"part"``: one per text variant
(``plain``, ``speaker``) of ``infer=False`` (ingest, search, recall, bytes on disk), then
``infer`` (the ``infer=True`` ingest whose model calls the parent counts at its loopback
server), then ``versions``. With ``--ingest-only VARIANT`` it only adds every turn in that
variant and prints one ``"ingest"`` part (a round of the parent's interleaved ingest
comparison). Everything else (mem0's logging, warnings) goes to stderr.

Offline by construction: ``MEM0_TELEMETRY=False`` is set before mem0 is imported (its
PostHog client is never made), spaCy and fastembed are not installed in its venv (mem0 then
skips its lemmatizer, entity extraction and BM25 keyword search instead of downloading
their models; see bench/peers.py's docstring), no reranker is configured, and the one model
it calls is the parent's loopback server.
"""

from __future__ import annotations

import os

os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import importlib.metadata
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _recall_data import DEFAULT_DATA, KS, LIMIT, Conversation, Score, load
from langchain_core.embeddings import Embeddings

from fermix.embedding import WordLlamaEmbedder

VARIANTS = ("plain", "speaker")
"""mem0's text of a turn: the turn alone, or ``"Speaker: text"``."""


class WordLlamaEmbeddings(Embeddings):
    """fermix's offline embedder (wordllama's table and tokenizer) as a LangChain
    ``Embeddings``, for mem0's ``langchain`` embedder provider. mem0 embeds one text at a
    time and keeps no per-scope token counts, so the tokens are pooled with equal weight."""

    def __init__(self) -> None:
        self._embedder = WordLlamaEmbedder()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in self._embedder.embed(texts)]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def emit(obj: dict[str, Any]) -> None:
    """One JSON line to the parent."""
    print(json.dumps(obj), flush=True)


def mem0_memory(workdir: Path, name: str, model_url: str) -> Any:
    """A mem0 ``Memory``: Qdrant in local mode on disk under ``workdir``, its history
    database there too, the wordllama embedder, the loopback model."""
    from mem0 import Memory

    workdir.mkdir(parents=True)
    return Memory.from_config(
        {
            "vector_store": {
                "provider": "qdrant",
                "config": {
                    "collection_name": name,
                    "path": str(workdir / "qdrant"),
                    "embedding_model_dims": WordLlamaEmbedder().dimension(),
                    "on_disk": True,
                },
            },
            "embedder": {"provider": "langchain", "config": {"model": WordLlamaEmbeddings()}},
            "llm": {
                "provider": "openai",
                "config": {"model": "bench", "openai_base_url": model_url, "api_key": "loopback"},
            },
            "history_db_path": str(workdir / "history.db"),
        }
    )


def text_of(variant: str, speaker: str, content: str) -> str:
    """A turn as mem0 stores it in ``variant``."""
    return content if variant == "plain" else f"{speaker}: {content}"


def disk_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def add_all(memory: Any, variant: str, convs: list[Conversation]) -> tuple[float, list[int]]:
    """``infer=False``: every turn in one ``add`` each; the seconds it took, and each add's ns."""
    latencies: list[int] = []
    start = time.perf_counter_ns()
    for conv in convs:
        for turn in conv.turns:
            t0 = time.perf_counter_ns()
            memory.add(
                [{"role": "user", "content": text_of(variant, turn.speaker, turn.content)}],
                user_id=conv.sample_id,
                metadata={"dia": turn.dia},
                infer=False,
            )
            latencies.append(time.perf_counter_ns() - t0)
    return (time.perf_counter_ns() - start) / 1e9, latencies


def run_variant(
    variant: str, convs: list[Conversation], workdir: Path, model_url: str
) -> dict[str, Any]:
    """``infer=False``: add every turn, one ``add`` each, then ask every question."""
    memory = mem0_memory(workdir, f"locomo_{variant}", model_url)
    ingest_s, latencies = add_all(memory, variant, convs)
    turns = len(latencies)
    score = Score(f"mem0 {variant}")
    for conv in convs:
        for question in conv.questions:
            t0 = time.perf_counter()
            found = memory.search(
                question.text, top_k=LIMIT, filters={"user_id": conv.sample_id}, threshold=0.0
            )
            elapsed = (time.perf_counter() - t0) * 1000
            dias = [hit["metadata"]["dia"] for hit in found["results"]]
            score.add(conv.sample_id, question, dias, elapsed)
    memory.close()
    return {
        "part": variant,
        "turns": turns,
        "ingest_s": ingest_s,
        "add_ms": [ns / 1e6 for ns in latencies],
        "bytes": disk_bytes(workdir),
        "found": {
            sid: [[q.text, q.category, sorted(q.evidence), dias] for q, dias in items]
            for sid, items in score.found.items()
        },
        "search_ms": score.times_ms,
    }


def run_infer(convs: list[Conversation], workdir: Path, model_url: str) -> dict[str, Any]:
    """``infer=True``: every exchange (two turns, as mem0's own LoCoMo evaluation adds
    them) in one ``add``, each speaker's message with its name; the model calls are counted
    by the parent's loopback server."""
    memory = mem0_memory(workdir, "locomo_infer", model_url)
    messages = adds = 0
    start = time.perf_counter()
    for conv in convs:
        for i in range(0, len(conv.turns), 2):
            pair = conv.turns[i : i + 2]
            memory.add(
                [{"role": "user", "content": t.content, "name": t.speaker} for t in pair],
                user_id=conv.sample_id,
                infer=True,
            )
            messages += len(pair)
            adds += 1
    memory.close()
    return {
        "part": "infer",
        "user_messages": messages,
        "adds": adds,
        "ingest_s": time.perf_counter() - start,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--model-url", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ingest-only", choices=VARIANTS, help="one ingest round, no search")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    convs = load(args.data, quick=args.quick)
    if args.ingest_only:
        variant = args.ingest_only
        memory = mem0_memory(args.workdir / variant, f"locomo_{variant}", args.model_url)
        ingest_s, latencies = add_all(memory, variant, convs)
        memory.close()
        emit({"part": "ingest", "variant": variant, "turns": len(latencies), "ingest_s": ingest_s})
        return 0
    for variant in VARIANTS:
        emit(run_variant(variant, convs, args.workdir / variant, args.model_url))
    emit(run_infer(convs, args.workdir / "infer", args.model_url))
    emit(
        {
            "part": "versions",
            **{
                name: importlib.metadata.version(name)
                for name in ("mem0ai", "qdrant-client", "langchain", "langchain-core", "openai")
            },
            "ks": list(KS),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
