"""The sections of docs/integrations.md, whose hosts the integration tests run as written
(I6): one ``## `` section per framework."""

from __future__ import annotations

from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"


def section(heading: str) -> str:
    """The text of the section ``## {heading}``, up to the next ``## `` heading."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : None if end < 0 else end]
