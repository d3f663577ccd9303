"""docs/requirements.md documents every requirement ID the code, tests and benchmarks cite.

IDs are cited in upper case in docstrings and comments (``(SC3)``, ``(K1-K5)``) and in lower
case in test names (``test_a1_s1_e2_...``). The scan skips what only looks like an ID: ruff
codes in ``noqa`` comments, "C0/C1 controls" (control characters), latency percentiles, and
lower-case tokens outside test names (agent ids in fixtures, BM25's ``k1``, URL paths).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

THIS_FILE = Path(__file__).resolve()
ROOT = THIS_FILE.parents[2]
DOC = ROOT / "docs" / "requirements.md"
SCANNED_DIRS = ("fermix", "tests", "bench")
SCANNED_SUFFIXES = {".py", ".md", ".sql"}

# The spec's sections, by ID prefix. SC before S so that "SC3" is not read as "S".
PREFIXES = (
    *("S", "A", "C", "SC", "E", "K", "T", "P", "V", "H", "M", "N", "Q", "B"),
    *("F", "I", "W", "O"),
)
_PREFIX = r"(?:SC|[SACEKTPVHMNQBFIWO])"
# One or two digits, no leading zero: ruff codes (E501, B008, C901, BLE001) never match.
_NUMBER = r"[1-9][0-9]?"

CITED_ID = re.compile(rf"\b({_PREFIX})({_NUMBER})\b")
"""``S4``, ``SC3``, ``E10`` as whole words, upper case only."""

CITED_RANGE = re.compile(rf"\b({_PREFIX})({_NUMBER})\s*(?:-|\u2013|\.\.)\s*\1?({_NUMBER})\b")
"""``K1-K5``, ``SC1-SC3``, ``E1..E10`` (or an en dash): every ID from the first to the last."""

TEST_NAME = re.compile(rf"\btest_((?:{_PREFIX.lower()}{_NUMBER}_)+)")
"""``test_s4_...``, ``test_sc3_...``, ``test_a1_s1_e2_...``: the IDs leading a test's name."""

NOISE = (
    re.compile(r"(?i)#\s*noqa\b.*$"),  # lint codes after noqa, as BLE001
    re.compile(r"\bC[01](?:\s*(?:/|,|and)\s*C1)?\s+controls?\b"),  # "C0/C1 controls"
    re.compile(r"(?<![A-Za-z0-9])[Pp](?:50|75|90|95|99|999)(?![0-9])"),  # p50, P99 latencies
)

DOC_SECTION = re.compile(r"^## (SC|[A-Z]) — \S")
DOC_ID_LINE = re.compile(r"^- \*\*(SC|[A-Z])([1-9][0-9]*)\*\* (?:\(planned\) )?\S")


def _doc_ids() -> list[tuple[str, int, str]]:
    """Each ID line of the doc as (prefix, number, section prefix); a malformed line fails."""
    ids: list[tuple[str, int, str]] = []
    section = ""
    for number, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("## "):
            heading = DOC_SECTION.match(line)
            section = heading.group(1) if heading else ""
        elif line.startswith("- **"):
            match = DOC_ID_LINE.match(line)
            assert match, f"docs/requirements.md:{number}: not an ID line: {line!r}"
            ids.append((match.group(1), int(match.group(2)), section))
    return ids


def documented_ids() -> set[str]:
    return {f"{prefix}{number}" for prefix, number, _ in _doc_ids()}


def ids_in_line(line: str) -> set[str]:
    """The requirement IDs one line of source or Markdown cites."""
    for noise in NOISE:
        line = noise.sub(" ", line)
    ids = {prefix + number for prefix, number in CITED_ID.findall(line)}
    for prefix, first, last in CITED_RANGE.findall(line):
        ids |= {f"{prefix}{n}" for n in range(int(first), int(last) + 1)}
    for group in TEST_NAME.findall(line):
        ids |= {part.upper() for part in group.split("_") if part}
    return ids


def _scanned_files() -> Iterator[Path]:
    yield ROOT / "README.md"
    for name in SCANNED_DIRS:
        for path in sorted((ROOT / name).rglob("*")):
            skipped = path == THIS_FILE or "__pycache__" in path.parts  # examples, not citations
            if path.suffix in SCANNED_SUFFIXES and not skipped:
                yield path


def citations() -> Iterator[tuple[str, str]]:
    """Every (``path:line``, ID) cited in fermix/, tests/, bench/ and the README."""
    for path in _scanned_files():
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            for cited in sorted(ids_in_line(line)):
                yield f"{path.relative_to(ROOT)}:{number}", cited


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('"""Storage layer on real SQLite (S1, S4, SC3)."""', {"S1", "S4", "SC3"}),
        ("# -- hostile answers (E4, E5, SC3) --", {"E4", "E5", "SC3"}),
        ("(K1-K3, K5)", {"K1", "K2", "K3", "K5"}),
        ("(SC1-SC3) and (E1-E10)", {"SC1", "SC2", "SC3"} | {f"E{n}" for n in range(1, 11)}),
        ("the command line (E10)", {"E10"}),
        ("(E1\u2013E3, S1..S2)", {"E1", "E2", "E3", "S1", "S2"}),
        ("def test_s4_fts_follows_update() -> None:", {"S4"}),
        ("def test_a1_s1_e2_nothing_acknowledged_is_lost(", {"A1", "S1", "E2"}),
        ("def test_sc3_a_guest_sees_only_its_own_rows(", {"SC3"}),
        ("except Exception:  # noqa: BLE001", set()),
        ("x = 1  # noqa: E501, B008, S101", set()),
        ("# Cut points: whitespace, C0/C1 controls and NUL", set()),
        ("# C0 and C1 controls, DEL", set()),
        ('print(f"p50 {p50:.1f} ms, P99 {p99:.1f} ms")', set()),
        ("def test_p99_stays_under_a_second(", set()),
        ('agents = ["a1", "a2"]; k1 = 1.2; url = "/v1/chat"', set()),
        ("SHA1, UTF-8, E2E, 128K, T0, B0, A10X, S1a", set()),
        ("def _test_a1_helper(", set()),
    ],
)
def test_the_citation_scan_finds_how_ids_are_cited_and_skips_what_only_looks_like_one(
    line: str, expected: set[str]
) -> None:
    assert ids_in_line(line) == expected


def test_the_doc_has_every_section_with_ids_numbered_from_one_under_their_own_heading() -> None:
    ids = _doc_ids()
    misplaced = [f"{p}{n} under {s or 'no section'}" for p, n, s in ids if p != s]
    assert not misplaced, f"IDs outside their section: {misplaced}"
    for prefix in PREFIXES:
        numbers = sorted(n for p, n, _ in ids if p == prefix)
        assert numbers, f"docs/requirements.md has no {prefix} requirements"
        assert numbers == list(range(1, len(numbers) + 1)), f"{prefix} IDs: {numbers}"


def test_every_requirement_id_has_exactly_one_line_in_the_doc() -> None:
    counts = Counter(f"{prefix}{number}" for prefix, number, _ in _doc_ids())
    assert not [i for i, count in counts.items() if count > 1], f"repeated: {counts}"


def test_every_id_cited_in_the_code_tests_and_benchmarks_is_documented() -> None:
    documented = documented_ids()
    missing = [f"{where}: {cited}" for where, cited in citations() if cited not in documented]
    assert not missing, "cited but not in docs/requirements.md:\n" + "\n".join(missing)
