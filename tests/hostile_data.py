"""The hostile-input catalogue (``tests/data/hostile_inputs.json``), expanded: every text
(the generated specials built) and every number, for the tests that throw them at an entry
point (the library, the HTTP API, the MCP tools)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CATALOGUE = json.loads((Path(__file__).parent / "data" / "hostile_inputs.json").read_text())


def _generated(spec: dict[str, Any]) -> str:
    if "repeat" in spec:
        return str(spec["repeat"]) * int(spec["times"])
    if "nested_list_depth" in spec:
        depth = int(spec["nested_list_depth"])
        return "[" * depth + "]" * depth
    depth = int(spec["nested_object_depth"])
    return '{"a":' * depth + "1" + "}" * depth


TEXTS: list[str] = CATALOGUE["texts"] + [_generated(g) for g in CATALOGUE["generated"]]
NUMBERS: list[Any] = CATALOGUE["numbers"]
