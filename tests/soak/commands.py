"""The JSON-lines loop a second-process host serves: one command in, one answer out."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from fermix.api import Memory
from fermix.errors import FermixError


def serve(memory: Memory, make: Callable[[Memory], object]) -> int:
    """Start ``memory``, build the target with ``make(memory)``, then run each line of
    stdin, ``{"op": name, ...}``, as ``target.name(**rest)`` until ``quit``, answering
    each with one JSON line."""
    memory.start()
    target = make(memory)
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            command = json.loads(line)
            op = command.pop("op")
            if op == "quit":
                break
            try:
                answer: dict[str, Any] = {"ok": getattr(target, op)(**command)}
            except FermixError as exc:
                answer = {"error": type(exc).__name__, "message": str(exc)}
            print(json.dumps(answer), flush=True)
    finally:
        memory.close()
    print(json.dumps({"done": True}), flush=True)
    return 0
