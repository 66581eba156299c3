"""The ``math`` reward: Math-Verify in a child process with a hard time limit.

``MathVerifyReward()(response, gold)`` parses both with Math-Verify and returns
``verify(gold_parsed, answer_parsed)`` (gold first: Math-Verify's comparison is not symmetric) as
1.0 or 0.0. Parsing and verification run in a long-lived worker process
(``hacrl_core.rewards.math_worker``); if it does not answer within ``timeout_s`` it is killed, the
response scores 0 and ``math/timeout`` is counted, and a fresh worker starts on the next call.
The caller never hangs on a response.

Rejected before reaching the worker, with 0 and a counted reason: responses over ``MAX_CHARS``
characters (``too_long``) and responses whose bracket nesting (``{[(``) exceeds ``max_depth``
(``too_deep``), which would otherwise recurse deep inside the LaTeX parser.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

from hacrl_core.rewards.registry import MAX_CHARS, RewardFn, count, register_reward

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_DEPTH = 50
#: Address-space limit of the worker process (bytes); 0 disables it.
DEFAULT_MEMORY_LIMIT = 4 << 30
START_TIMEOUT_S = 120.0

_LIVE: weakref.WeakSet[MathVerifyReward] = weakref.WeakSet()


def nesting_depth(text: str) -> int:
    """Deepest nesting of ``{``, ``[`` and ``(`` in ``text`` (one linear scan)."""
    depth = deepest = 0
    for char in text:
        if char in "{[(":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif char in "}])" and depth:
            depth -= 1
    return deepest


class VerifierTimeout(Exception):
    """The worker did not answer in time and was killed."""


class MathVerifyReward:
    """Callable ``(response, gold) -> float`` backed by one worker process (thread-safe, serial).

    Args:
        timeout_s: wall-clock limit per request; the worker is killed when it is exceeded.
        max_depth: bracket nesting above which a response is rejected as ``too_deep``.
        memory_limit_bytes: address-space limit of the worker (``RLIMIT_AS``); 0 for none.
    """

    name = "math"

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        max_depth: int = DEFAULT_MAX_DEPTH,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.max_depth = max_depth
        self.memory_limit_bytes = memory_limit_bytes
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._started = 0
        _LIVE.add(self)

    # -- public -----------------------------------------------------------------------------

    def __call__(self, response: str, gold: str) -> float:
        rejected = self._reject(response)
        if rejected:
            count(self.name, rejected)
            return 0.0
        try:
            value = self._request({"op": "verify", "gold": gold, "response": response})
        except VerifierTimeout:
            count(self.name, "timeout")
            return 0.0
        except RuntimeError:
            count(self.name, "error")
            return 0.0
        return float(value)

    def check_gold(self, gold: str) -> None:
        """Raise ``ValueError`` unless Math-Verify parses ``gold`` to a math object in time."""
        rejected = self._reject(gold)
        if rejected:
            raise ValueError(f"math reward: gold answer rejected ({rejected})")
        try:
            usable = self._request({"op": "gold", "gold": gold})
        except VerifierTimeout:
            raise ValueError(
                f"math reward: parsing gold answer {gold[:200]!r} timed out after {self.timeout_s} s"
            ) from None
        except RuntimeError as error:
            raise ValueError(f"math reward: gold answer {gold[:200]!r} failed to parse: {error}") from None
        if not usable:
            raise ValueError(f"math reward: Math-Verify cannot parse gold answer {gold[:200]!r}")

    def close(self) -> None:
        """Stop the worker (a later call starts a new one)."""
        with self._lock:
            self._kill()

    # -- internals --------------------------------------------------------------------------

    def _reject(self, text: str) -> str | None:
        if len(text) > MAX_CHARS:
            return "too_long"
        if nesting_depth(text) > self.max_depth:
            return "too_deep"
        return None

    def _request(self, request: dict[str, Any]) -> Any:
        payload = (json.dumps(request) + "\n").encode("utf-8", errors="surrogatepass")
        with self._lock:
            proc = self._ensure_worker()
            try:
                assert proc.stdin is not None
                proc.stdin.write(payload)
                proc.stdin.flush()
                reply = self._read_line(self.timeout_s)
            except (BrokenPipeError, EOFError, OSError) as error:
                self._kill()
                raise RuntimeError(f"math verifier process died: {error}") from None
            except VerifierTimeout:
                self._kill()
                raise
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error", "unknown error"))
        return reply["value"]

    def _ensure_worker(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._kill()
        if self._started:
            count(self.name, "worker_restart")
        self._started += 1
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "hacrl_core.rewards.math_worker", str(self.memory_limit_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            ready = self._read_line(START_TIMEOUT_S)
        except (VerifierTimeout, EOFError) as error:
            self._kill()
            raise RuntimeError(
                f"math verifier process failed to start ({type(error).__name__}); is math-verify installed?"
            ) from None
        if not ready.get("ready"):
            self._kill()
            raise RuntimeError(f"math verifier process sent {ready!r} instead of ready")
        return self._proc

    def _read_line(self, timeout_s: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise VerifierTimeout()
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("math verifier process closed its output")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self._buffer = b""
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def __del__(self) -> None:  # best effort; atexit covers interpreter shutdown
        try:
            self._kill()
        except Exception:  # noqa: BLE001
            pass


@atexit.register
def _close_all() -> None:
    for reward in list(_LIVE):
        reward._kill()


def _validate_math_gold(gold: str) -> None:
    from hacrl_core.rewards.registry import get_reward

    reward = get_reward("math")
    assert isinstance(reward, MathVerifyReward)
    reward.check_gold(gold)


@register_reward("math", validate_gold=_validate_math_gold)
def _math_factory() -> RewardFn:
    return MathVerifyReward()
