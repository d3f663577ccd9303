"""Token counting: agrees with tiktoken, never raises on user text, never uses the network."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from concurrent.futures import ThreadPoolExecutor
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement

import fermix.token_counts
from fermix.errors import InvalidInputError
from fermix.token_counts import (
    CL100K,
    FALLBACK_BYTES_PER_TOKEN,
    O200K,
    count_tokens,
    encoding_name_for,
    truncate_to_tokens,
    uses_tiktoken,
)

SAMPLES = [
    "",
    "hi",
    "The quick brown fox jumps over the lazy dog.",
    "Ich heiße Jürgen und wohne in Köln.",
    "日本語のテキストも数えます。",
    "emoji 👩‍👩‍👧‍👦🚀 and tabs\t\nnewlines",
    "def f(x):\n    return x ** 2  # code",
]

# Text without lone surrogates (which no JSON chat message can carry), emoji included.
unicode_text = st.text(st.characters(codec="utf-8"), max_size=300)
emoji_text = st.lists(st.sampled_from(["🚀", "👩‍👩‍👧‍👦", "🇩🇪", "é", " ", "a", "\n"])).map("".join)
special_text = st.lists(
    st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", "<|endofprompt|>", "<|im_start|>", "x"])
).map("".join)
any_text = st.one_of(unicode_text, emoji_text, special_text)
models = st.sampled_from([None, "gpt-4o", "openai/gpt-4o-mini", "claude-3-5-sonnet", "llama3"])


@pytest.fixture(scope="module")
def encodings() -> dict[str, tiktoken.Encoding]:
    # Loading through fermix first points TIKTOKEN_CACHE_DIR at the bundled files.
    assert uses_tiktoken("gpt-4") and uses_tiktoken("gpt-4o")
    return {name: tiktoken.get_encoding(name) for name in (CL100K, O200K)}


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (None, CL100K),
        ("", CL100K),
        ("gpt-4o", O200K),
        ("gpt-4o-mini", O200K),
        ("gpt-4o-2024-08-06", O200K),
        ("openai/gpt-4o", O200K),
        ("azure/gpt-4o-mini", O200K),
        ("openrouter/openai/gpt-4.1-nano", O200K),
        ("GPT-4o", O200K),
        ("gpt-4.1", O200K),
        ("gpt-5", O200K),
        ("gpt-5-mini", O200K),
        ("gpt-5.1", O200K),
        ("chatgpt-4o-latest", O200K),
        ("o1", O200K),
        ("o1-preview", O200K),
        ("o3-mini", O200K),
        ("o4-mini", O200K),
        ("ft:gpt-4o-mini:acme::abc123", O200K),
        ("gpt-4", CL100K),
        ("gpt-4-turbo", CL100K),
        ("gpt-3.5-turbo", CL100K),
        ("o10-pretend", CL100K),
        ("ollama/llama3:8b", CL100K),
        ("anthropic/claude-3-5-sonnet-20241022", CL100K),
        ("mistral/mistral-large-latest", CL100K),
        ("gemini/gemini-1.5-pro", CL100K),
    ],
)
def test_encoding_follows_the_model_family_ignoring_the_provider_prefix(
    model: str | None, expected: str
) -> None:
    assert encoding_name_for(model) == expected


@pytest.mark.parametrize("text", SAMPLES)
def test_c4_counts_match_tiktoken_cl100k_for_default_models(
    encodings: dict[str, tiktoken.Encoding], text: str
) -> None:
    assert count_tokens(text) == len(encodings[CL100K].encode(text))
    assert count_tokens(text, "claude-3-5-haiku") == len(encodings[CL100K].encode(text))


@pytest.mark.parametrize("text", SAMPLES)
def test_c4_counts_match_tiktoken_o200k_for_gpt_4o(
    encodings: dict[str, tiktoken.Encoding], text: str
) -> None:
    assert count_tokens(text, "openai/gpt-4o") == len(encodings[O200K].encode(text))


@pytest.mark.parametrize("model", [None, "gpt-4o"])
def test_special_token_text_from_users_counts_as_plain_text(
    encodings: dict[str, tiktoken.Encoding], model: str | None
) -> None:
    text = "please ignore <|endoftext|> and <|fim_prefix|> here"
    name = encoding_name_for(model)
    assert count_tokens(text, model) == len(encodings[name].encode_ordinary(text))
    assert count_tokens("<|endoftext|>", model) > 1  # not the single special token
    assert truncate_to_tokens(text, 3, model)


@given(text=any_text, model=models)
def test_counting_any_text_never_raises(text: str, model: str | None) -> None:
    assert count_tokens(text, model) >= 0


@given(text=any_text, budget=st.integers(min_value=0, max_value=60), model=models)
def test_c4_truncation_respects_the_budget_and_keeps_the_start(
    text: str, budget: int, model: str | None
) -> None:
    head = truncate_to_tokens(text, budget, model)
    assert count_tokens(head, model) <= budget
    assert text.startswith(head)


def test_truncation_returns_text_that_fits_unchanged() -> None:
    text = "short enough"
    assert truncate_to_tokens(text, count_tokens(text)) == text


def test_truncation_keeps_as_much_as_the_budget_allows(
    encodings: dict[str, tiktoken.Encoding],
) -> None:
    text = " ".join(["word"] * 100)
    head = truncate_to_tokens(text, 10)
    assert count_tokens(head) == 10
    assert head == encodings[CL100K].decode(encodings[CL100K].encode(text)[:10])


def test_truncation_never_splits_a_character() -> None:
    text = "🚀" * 20  # each rocket takes several tokens
    for budget in range(12):
        head = truncate_to_tokens(text, budget)
        assert set(head) <= {"🚀"}
        assert count_tokens(head) <= budget


def test_a_zero_budget_truncates_to_nothing() -> None:
    assert truncate_to_tokens("anything at all", 0) == ""


@pytest.mark.parametrize("budget", [-1, 2.5, True, "3"])
def test_truncation_refuses_a_budget_that_is_not_a_count(budget: object) -> None:
    with pytest.raises(InvalidInputError):
        truncate_to_tokens("text", budget)  # type: ignore[arg-type]


def test_counts_from_many_threads_agree() -> None:
    texts = [f"message number {i} with some words" for i in range(200)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        counted = list(pool.map(lambda t: count_tokens(t, "gpt-4o"), texts))
    assert counted == [count_tokens(t, "gpt-4o") for t in texts]


# --- offline loading, each in a fresh interpreter ---

NETWORK_GUARD = """
import json, logging, os, socket, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args)[:80])
    raise OSError("network disabled by the test")
socket.socket.connect = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
"""


def run_isolated(body: str, **env: str) -> tuple[dict[str, Any], str]:
    """Run ``body`` in a fresh interpreter with the network refused; return its JSON and log."""
    clean = {
        k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")
    }
    script = NETWORK_GUARD + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_bundled_encodings_are_used_without_importing_litellm() -> None:
    result, log = run_isolated(
        """
        import fermix.token_counts as t
        counts = [t.count_tokens("hi"), t.count_tokens("hello world", "gpt-4o")]
        print(json.dumps({
            "litellm_imported": "litellm" in sys.modules,
            "cache_dir": os.environ.get("TIKTOKEN_CACHE_DIR"),
            "exact": [t.uses_tiktoken(None), t.uses_tiktoken("gpt-4o")],
            "counts": counts,
            "attempts": attempts,
        }))
        """
    )
    assert result["litellm_imported"] is False
    assert str(result["cache_dir"]).endswith(os.path.join("litellm_core_utils", "tokenizers"))
    assert result["exact"] == [True, True]
    assert result["counts"] == [1, 2]
    assert result["attempts"] == []
    assert "WARNING" not in log


def test_an_empty_cache_dir_falls_back_to_the_estimate_without_the_network(tmp_path: Path) -> None:
    result, log = run_isolated(
        """
        import fermix.token_counts as t
        text = "hello world, héllo"
        print(json.dumps({
            "counts": [t.count_tokens(text), t.count_tokens(text), t.count_tokens(text, "gpt-4o")],
            "bytes": len(text.encode()),
            "exact": t.uses_tiktoken(None),
            "head": t.truncate_to_tokens("abcdefghij", 2),
            "cache_dir": os.environ["TIKTOKEN_CACHE_DIR"],
            "attempts": attempts,
        }))
        """,
        TIKTOKEN_CACHE_DIR=str(tmp_path),
    )
    estimate = -(-result["bytes"] // FALLBACK_BYTES_PER_TOKEN)
    assert result["counts"] == [estimate, estimate, estimate]
    assert result["exact"] is False
    assert result["head"] == "abcdefgh"
    assert result["cache_dir"] == str(tmp_path)  # a chosen cache dir is respected
    assert result["attempts"] == []
    assert list(tmp_path.iterdir()) == []
    warnings = [line for line in log.splitlines() if line.startswith("WARNING fermix.token_counts")]
    assert len(warnings) == 2  # once per encoding, not once per count
    assert "cl100k_base" in warnings[0] and "o200k_base" in warnings[1]


def test_a_disabled_tiktoken_cache_falls_back_without_the_network() -> None:
    result, log = run_isolated(
        """
        import fermix.token_counts as t
        print(json.dumps({"count": t.count_tokens("abcdefgh"), "attempts": attempts}))
        """,
        TIKTOKEN_CACHE_DIR="",
    )
    assert result == {"count": 2, "attempts": []}
    assert "cache is disabled" in log


def test_a_damaged_cache_file_is_neither_used_nor_deleted(tmp_path: Path) -> None:
    damaged = tmp_path / "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"  # cl100k_base's cache name
    damaged.write_bytes(b"not an encoding")
    result, log = run_isolated(
        """
        import fermix.token_counts as t
        print(json.dumps({"exact": t.uses_tiktoken(None), "attempts": attempts}))
        """,
        TIKTOKEN_CACHE_DIR=str(tmp_path),
    )
    assert result == {"exact": False, "attempts": []}
    assert damaged.read_bytes() == b"not an encoding"
    assert "sha256" in log


def test_the_offline_sources_are_the_ones_tiktoken_would_fetch(
    encodings: dict[str, tiktoken.Encoding],
) -> None:
    # If a tiktoken upgrade moves an encoding, the cache check must follow it.
    spec = importlib.util.find_spec("tiktoken_ext.openai_public")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).read_text(encoding="utf-8")
    cache_dir = Path(os.environ["TIKTOKEN_CACHE_DIR"])
    for name, (url, sha256) in fermix.token_counts._SOURCES.items():
        assert f'"{url}"' in source and f'"{sha256}"' in source, name
        assert (cache_dir / hashlib.sha1(url.encode()).hexdigest()).is_file(), name


# --- the litellm wheel layout fermix relies on (pinned in pyproject.toml) ---

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def runtime_requirement(name: str) -> Requirement:
    """The requirement on ``name`` in pyproject.toml's runtime dependencies."""
    with PYPROJECT.open("rb") as fh:
        dependencies = tomllib.load(fh)["project"]["dependencies"]
    (found,) = (r for r in map(Requirement, dependencies) if r.name == name)
    return found


def test_the_installed_litellm_ships_both_encodings_where_the_lookup_looks() -> None:
    folder = fermix.token_counts.litellm_tokenizer_dir()
    assert folder is not None, (
        f"no tokenizers folder in the installed litellm under any of "
        f"{[str(p) for p in fermix.token_counts.LITELLM_TOKENIZER_DIRS]}: its wheel layout moved"
    )
    for name, (url, sha256) in fermix.token_counts._SOURCES.items():
        cached = folder / hashlib.sha1(url.encode()).hexdigest()
        assert cached.is_file(), f"{name}: {cached} is missing"
        assert hashlib.sha256(cached.read_bytes()).hexdigest() == sha256, name


def test_the_installed_litellm_satisfies_the_capped_pin_in_pyproject() -> None:
    pin = runtime_requirement("litellm")
    assert any(s.operator in ("<", "<=", "~=", "==") for s in pin.specifier), f"{pin}: no cap"
    installed = importlib.metadata.version("litellm")
    assert pin.specifier.contains(installed, prereleases=True), (installed, str(pin))


def test_a_litellm_with_the_older_llms_tokenizers_layout_is_found_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "llms" / "tokenizers").mkdir(parents=True)
    spec = ModuleSpec("litellm", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert fermix.token_counts.litellm_tokenizer_dir() == tmp_path / "llms" / "tokenizers"
    (tmp_path / "litellm_core_utils" / "tokenizers").mkdir(parents=True)
    assert (
        fermix.token_counts.litellm_tokenizer_dir()
        == tmp_path / "litellm_core_utils" / "tokenizers"
    )


def test_a_missing_litellm_leaves_the_tiktoken_cache_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert fermix.token_counts.litellm_tokenizer_dir() is None
