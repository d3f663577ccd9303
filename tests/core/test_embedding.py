"""The embedding edge (Q1): the offline default and litellm models, the config section."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from model_server import EMBEDDING_DIM, ModelServer

from fermix import embedding
from fermix.config import Config, EmbeddingConfig, parse_config
from fermix.embedding import (
    EmbeddingError,
    LiteLLMEmbedder,
    TokenCounts,
    WordLlamaEmbedder,
    from_blobs,
    from_config,
    to_blob,
    to_int8,
)
from fermix.errors import ConfigError


def test_q1_the_offline_model_loads_and_embeds_with_the_network_refused() -> None:
    code = (
        "import socket\n"
        "def refuse(*a, **k):\n"
        "    raise OSError('network refused by the test')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "socket.getaddrinfo = refuse\n"
        "import logging, sys\n"
        "before = (logging.root.level, list(logging.root.handlers))\n"
        "from fermix.embedding import WordLlamaEmbedder\n"
        "e = WordLlamaEmbedder()\n"
        "v = e.embed(['Mel got married in June'])\n"
        "assert e.dimension() == 256 and v.shape == (1, 256), v.shape\n"
        "assert abs(float((v * v).sum()) - 1) < 1e-5\n"
        "assert 'litellm' not in sys.modules\n"
        # wordllama's own __init__ calls logging.basicConfig(level=INFO): never run it, or
        # the host's root logger prints every library's INFO line (litellm's to stdout)
        "assert (logging.root.level, list(logging.root.handlers)) == before\n"
        "assert 'wordllama' not in sys.modules\n"
        "print('ok')\n"
    )
    env = {"HF_HUB_OFFLINE": "0", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


FORK_AFTER_USE = """
import os, json, select, signal, sys, threading, time
from fermix import Memory
from fermix import embedding
from fermix.runtime import indexing

FILLER = ["I bought a new bike yesterday", "The weather is nice today", "My cat is called Tom",
          "Mel got married in June", "Work was busy this week", "The train was late again"]
RECALL = {"function": {"name": "memory_recall", "arguments": json.dumps(
    {"query": "sister's wedding", "source": "history"})}}


def use(memory, chat):
    conv = memory.conversation("agent", "tg", chat, owner_id="me")
    for text in FILLER:
        conv.append_user(text)
    assert memory._runtime.services.indexer.wait_idle(30)
    found = json.loads(memory.tools.run(RECALL, conv))["history"]
    assert found[0]["content"] == "Mel got married in June", found  # through the vectors
    return conv


parent_home, child_home = sys.argv[1], sys.argv[2]
memory = Memory(parent_home).start()
conv = use(memory, "parent")
for i in range(200):  # the parent's embedder is busy when it forks
    conv.append_user(f"more text number {i} about trains and bikes")
# As if a thread of the parent held them at the fork (loading the model, registering).
embedding._LOAD_LOCK.acquire()
indexing._ACTIVE_LOCK.acquire()
pid = os.fork()
if pid == 0:
    # Should the child hang, every thread's stack goes to stderr (and so into the failure's
    # message) before the parent gives up on it.
    import faulthandler
    faulthandler.dump_traceback_later(50, exit=True)
    try:
        inherited = memory._runtime.services.indexer
        start = time.monotonic()
        inherited.stop(30)  # its thread stayed in the parent: nothing to join here
        assert time.monotonic() - start < 1, "joined a thread of the parent"
        with Memory(child_home) as mine:
            use(mine, "child")
        print("child ok", flush=True)
        os._exit(0)
    except BaseException:
        import traceback
        traceback.print_exc()
        os._exit(1)
embedding._LOAD_LOCK.release()
indexing._ACTIVE_LOCK.release()
pidfd = os.pidfd_open(pid)
if not select.select([pidfd], [], [], 60)[0]:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sys.exit("the forked child hung")
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
memory.close()
print("parent ok", flush=True)
"""


def test_q2_a_process_forked_after_using_the_embedder_embeds_and_searches(
    tmp_path: Path,
) -> None:
    """A host that forks after using fermix (gunicorn's preload, a zygote): the child stops
    nothing of its parent's, takes no lock a parent's thread held, and its own Memory
    embeds and searches with vectors."""
    homes = [tmp_path / "parent", tmp_path / "child"]
    proc = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_USE, *map(str, homes)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split("\n")[:2] == ["child ok", "parent ok"], proc.stdout + proc.stderr


@given(
    st.lists(st.lists(st.integers(0, 40), max_size=12), min_size=1, max_size=20),
    st.dictionaries(st.integers(0, 40), st.integers(1, 50), max_size=20),
    st.integers(1, 5),
)
def test_q1_grown_weights_are_those_of_counting_each_part_in_turn(
    texts: list[list[int]], before: dict[int, int], part_size: int
) -> None:
    """The indexer's one call per batch weighs each token as the counts would after
    each part before it and its own were added, bit for bit."""
    counts = TokenCounts(dict(before), sum(before.values()))
    parts = [i // part_size for i in range(len(texts))]
    flat = np.fromiter((t for text in texts for t in text), np.int64)
    lengths = np.array([len(text) for text in texts], np.int64)
    grown = counts.grown(flat, lengths, parts) if len(flat) else np.zeros(0, np.float32)
    assert counts.counts == before  # not changed
    expected, step = TokenCounts(dict(before), sum(before.values())), []
    for start in range(0, len(texts), part_size):
        part = texts[start : start + part_size]
        for text in part:
            expected.add(text)
        step.extend(expected.weights(np.array(text, np.int64)) for text in part)
    assert grown.tobytes() == (np.concatenate(step) if step else np.zeros(0, np.float32)).tobytes()


def _whole(texts: list[str]) -> list[list[int]]:
    """What the tokenizer gives each text whole, as the embedder did before its pieces."""
    tokenizer = embedding._wordllama()[1]
    cut = [t[: embedding.MAX_TEXT_CHARS] for t in texts]
    return [list(tokenizer.encode(t, add_special_tokens=False).ids) for t in cut]


_TEXT = st.lists(
    st.sampled_from(
        [
            " ",
            "  ",
            "\u2581",
            "\t",
            "\n",
            "a",
            "the",
            "cat",
            "Mel",
            "!",
            ".",
            "'s",
            "é",
            "中",
            "\U0001f600",
            "<s>",
            "</s>",
            "<unk>",
            "<",
            "s>",
            "\u00a0",
            "ing",
            "x" * 30,
        ]
    )
    | st.text(max_size=8),
    max_size=30,
).map("".join)


@given(st.lists(_TEXT, min_size=1, max_size=8))
def test_q1_tokens_by_pieces_are_the_whole_texts_tokens(texts: list[str]) -> None:
    """Each word's ids looked up alone are what the tokenizer gives the whole text: spaces
    and runs of them, the ``▁`` it maps them to, added tokens (``<s>``), any character."""
    assert embedding._wordllama() and embedding._SPECIALS is not None  # the pieces are used
    assert WordLlamaEmbedder().tokens(texts) == _whole(texts)


def test_q1_a_long_text_is_cut_where_it_was_and_pieces_recur_from_the_cache() -> None:
    long = "word " * (embedding.MAX_TEXT_CHARS // 4)
    texts = [long, "a cat sat", "the cat sat"]
    embedding._piece_ids.cache_clear()
    assert WordLlamaEmbedder().tokens(texts) == _whole(texts)
    assert embedding._piece_ids.cache_info().hits > 1000


def test_q1_a_tokenizer_whose_tokens_span_a_space_is_not_split_into_pieces() -> None:
    """Only a tokenizer that cannot merge across a space is split: another file (a token
    with ``▁`` inside, a pre-tokenizer of its own) is tokenized whole."""
    from tokenizers import Tokenizer, pre_tokenizers

    shipped = embedding._wordllama()[1]
    assert embedding._piecewise_specials(shipped) == ("<unk>", "<s>", "</s>")
    spec = json.loads(shipped.to_str())
    spec["model"]["vocab"]["New\u2581York"] = len(spec["model"]["vocab"])
    assert embedding._piecewise_specials(Tokenizer.from_str(json.dumps(spec))) is None
    split = Tokenizer.from_str(shipped.to_str())
    split.pre_tokenizer = pre_tokenizers.Whitespace()
    assert embedding._piecewise_specials(split) is None


def test_q1_a_vector_is_its_tokens_weighted_sum_in_order_whatever_texts_are_beside_it() -> None:
    texts = ["", "a cat", "The weather is nice today and tomorrow", "ok", "Mel got married in June"]
    embedder = WordLlamaEmbedder()
    tokens = embedder.tokens(texts)
    counts = TokenCounts()
    counts.add([t for text in tokens for t in text])
    together = embedder.embed(texts, tokens=tokens, counts=counts)
    table = embedding._wordllama()[0]
    for i, text in enumerate(texts):
        alone = embedder.embed([text], tokens=[tokens[i]], counts=counts)[0]
        assert alone.tobytes() == together[i].tobytes()
        total = np.zeros(table.shape[1], np.float32)
        weights = counts.weights(np.array(tokens[i], np.int64))
        for token, weight in zip(tokens[i], weights, strict=True):
            total = total + table[token] * weight  # one token after another
        assert together[i].tobytes() == embedding._unit(total[None, :])[0].tobytes()
    assert not together[0].any()  # no token: zeros


def test_q1_rarity_weights_lower_the_tokens_a_scope_repeats() -> None:
    counts = TokenCounts()
    counts.add([1, 1, 1, 1, 2])
    weights = counts.weights(np.array([1, 2, 3], dtype=np.int64))
    assert weights[0] < weights[1] < weights[2] == pytest.approx(1.0)


def test_q1_the_scope_counts_change_the_vector_and_every_vector_is_a_unit() -> None:
    e = WordLlamaEmbedder()
    texts = ["Caroline went to the LGBTQ support group", "Caroline likes painting sunsets"]
    tokens = e.tokens(texts)
    counts = TokenCounts()
    for found in tokens:
        counts.add(found)
    plain, weighted = e.embed(texts), e.embed(texts, tokens=tokens, counts=counts)
    assert np.allclose(np.linalg.norm(weighted, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(plain, weighted)
    assert not e.embed([""]).any()  # no token: a zero vector, never NaN


def test_q1_int8_vectors_round_trip_and_a_missing_or_foreign_blob_is_absent() -> None:
    v = WordLlamaEmbedder().embed(["a photo of a sunset over the lake"])
    blob = to_blob(to_int8(v)[0])
    assert len(blob) == 256
    back, present = from_blobs([blob, None, b"\x01" * 8], 256)
    assert present.tolist() == [True, False, False]
    assert float(back[0] @ v[0]) > 0.99
    assert not back[1].any() and not back[2].any()


@given(
    st.lists(
        st.one_of(st.none(), st.binary(min_size=4, max_size=4), st.binary(max_size=6)),
        max_size=12,
    )
)
def test_q1_blobs_read_whole_or_row_by_row_give_the_same_vectors(
    blobs: list[bytes | None],
) -> None:
    """Rows that all have a vector take from_blobs' C-level path, others its row-by-row
    one: both give what each row alone would (zeros and absent where it has none)."""
    back, present = from_blobs(blobs, 4)
    assert back.shape == (len(blobs), 4) and back.dtype == np.float32
    for row, blob, here in zip(back, blobs, present, strict=True):
        assert here == (blob is not None and len(blob) == 4)
        alone = np.frombuffer(blob, dtype=np.int8) / np.float32(127.0) if here else np.zeros(4)
        assert np.array_equal(row, alone.astype(np.float32))


def test_q1_the_config_section_picks_the_model(tmp_path: Path) -> None:
    assert isinstance(from_config(Config().embedding.model), WordLlamaEmbedder)
    config = parse_config(
        '[fermix_core.embedding]\nmodel = "openai/text-embedding-3-small"\n'
        'api_base = "http://localhost:1"\napi_key_env = "MY_KEY"\nbatch_size = 8\n',
        "config.toml",
    )
    assert config.embedding == EmbeddingConfig(
        model="openai/text-embedding-3-small",
        api_base="http://localhost:1",
        api_key_env="MY_KEY",
        batch_size=8,
    )
    made = from_config(
        config.embedding.model,
        api_base=config.embedding.api_base,
        api_key_env=config.embedding.api_key_env,
    )
    assert (
        isinstance(made, LiteLLMEmbedder) and made.name == "litellm/openai/text-embedding-3-small"
    )
    for bad in ("batch_size = 0", "enabled = 1", 'api_key_env = "sk-abc def"', 'model = " "'):
        with pytest.raises(ConfigError, match=r"fermix_core\.embedding"):
            parse_config(f"[fermix_core.embedding]\n{bad}\n", "config.toml")


def test_q1_a_litellm_model_is_called_through_litellm_embedding(
    model_server: ModelServer,
) -> None:
    """A litellm embedding model, reached over real HTTP on loopback (Q1): vectors in the
    order of the texts, unit length, the route's key and base sent."""
    e = LiteLLMEmbedder(
        "openai/text-embedding-3-small",
        api_base=model_server.url,
        api_key_env="K",
        environ={"K": "sk-test"},
    )
    vectors = e.embed(["my sister's wedding", "my sister's wedding in June", "tax forms"])
    assert vectors.shape == (3, EMBEDDING_DIM) and e.dimension() == EMBEDDING_DIM
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]  # in input order
    request = model_server.embedding_requests[0]
    assert request["model"] == "text-embedding-3-small"
    assert request["input"][0] == "my sister's wedding"
    assert not e.counts_tokens and e.tokens(["x"]) == [[]]


def test_q1_a_litellm_model_without_its_key_or_failing_is_an_embedding_error() -> None:
    with pytest.raises(EmbeddingError, match="holds no API key"):
        LiteLLMEmbedder("openai/x", api_key_env="NOT_SET", environ={}).embed(["a"])
    with socket.socket() as closed:  # a loopback port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    refused = LiteLLMEmbedder(
        "openai/x", api_base=f"http://127.0.0.1:{port}/v1", api_key_env="K", environ={"K": "k"}
    )
    with pytest.raises(EmbeddingError, match="openai/x"):
        refused.embed(["a"])
    assert Config().embedding.model == embedding.WORDLLAMA
