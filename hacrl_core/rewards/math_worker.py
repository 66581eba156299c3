"""Child process that runs Math-Verify for ``hacrl_core.rewards.math.MathVerifyReward``.

Run as ``python -m hacrl_core.rewards.math_worker [memory_limit_bytes]``. It speaks JSON lines:
reads ``{"op": "verify", "gold": ..., "response": ...}`` or ``{"op": "gold", "gold": ...}`` on
stdin and answers ``{"ok": true, "value": ...}`` or ``{"ok": false, "error": ...}`` on stdout, one
line per request; the first line it writes is ``{"ready": true}``. It exits on EOF.

Math-Verify's own ``signal.alarm`` timeouts are disabled (``parsing_timeout=None``,
``timeout_seconds=None``): they cannot interrupt C-level big-integer arithmetic, so the parent
enforces the time limit by killing this process. An optional address-space limit turns runaway
memory use into a ``MemoryError`` here instead of pressure on the machine.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from functools import lru_cache
from typing import Any


def _parse_gold(parse: Any, gold: str) -> list[Any]:
    """Parsed gold: as written if it carries its own delimiters, else inside ``\\boxed{}``."""
    if "\\boxed" in gold or "$" in gold:
        parsed = parse(gold, parsing_timeout=None)
    else:
        parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None) or parse("$" + gold + "$", parsing_timeout=None)
    return parsed


def serve(memory_limit_bytes: int = 0) -> None:
    if memory_limit_bytes > 0:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    from math_verify import parse, verify

    @lru_cache(maxsize=4096)
    def gold_parsed(gold: str) -> tuple[Any, ...]:
        return tuple(_parse_gold(parse, gold))

    def handle(request: dict[str, Any]) -> Any:
        gold = gold_parsed(request["gold"])
        if request["op"] == "gold":
            # A usable gold has at least one sympy object; a bare string is only a fallback match.
            return any(not isinstance(item, str) for item in gold)
        if request["op"] == "verify":
            if not gold:
                return 0.0
            answer = parse(request["response"], parsing_timeout=None)
            return 1.0 if verify(list(gold), answer, timeout_seconds=None) else 0.0
        raise ValueError(f"unknown op {request['op']!r}")

    # Keep the protocol channel private: anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            reply = {"ok": True, "value": handle(json.loads(line))}
        except BaseException as error:  # noqa: BLE001 - MemoryError, RecursionError too: report, keep serving
            if isinstance(error, KeyboardInterrupt):
                raise
            reply = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
