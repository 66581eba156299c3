"""Shared helpers of the benchmarks: specs, `hacrl run` subprocesses, machine facts, tables, JSON.

Every benchmark prints a plain-text table and writes ``bench/results/<name>.json`` (or the
``--out`` folder) with the raw numbers, the machine (``nproc``, ``lscpu``), the load
(``uptime``) and the date, so that a result can be read without rerunning it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
#: One tiny-model cache for every benchmark, so tiny:// models are built (and warm-started) once.
DEFAULT_CACHE = REPO / ".hacrl-cache"

# Two heterogeneous agents (different architecture, size and tokenizer) and their tuned learning
# rates on bare answers: the quickstart's until 2026-12-04 (examples/quickstart.yaml now trains the
# same presets on worked chains).
LLAMA = {"name": "llama-char", "preset": "llama-char", "lr": 1.0e-4}
QWEN = {"name": "qwen-bpe", "preset": "qwen2-bpe", "lr": 5.0e-5}


def machine() -> dict[str, Any]:
    """Date, host, CPU count, the first lines of lscpu and the load, for every result file."""

    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "date": run("date", "-Iseconds"),
        "nproc": int(run("nproc") or os.cpu_count() or 0),
        "lscpu": run("lscpu").splitlines()[:12],
        "uptime": run("uptime"),
        "python": platform.python_version(),
        "torch": _version("torch"),
    }


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - reporting only
        return "?"


def agent_document(
    name: str, model: str, *, lr: float, max_new_tokens: int = 8, batch_size: int = 128, micro_batch_size: int = 128
) -> dict[str, Any]:
    """One ``spec.agents`` entry."""
    return {
        "name": name,
        "model": model,
        "rollout": {"maxNewTokens": max_new_tokens, "batchSize": batch_size},
        "learner": {"lr": lr, "microBatchSize": micro_batch_size},
    }


def agent_entry(
    agent: dict[str, Any],
    *,
    warmup_steps: int | None,
    model_seed: int = 0,
    max_new_tokens: int = 8,
    batch_size: int = 128,
    micro_batch_size: int = 128,
) -> dict[str, Any]:
    """The agent entry of a quickstart agent (``LLAMA``, ``QWEN``) with the given warm start."""
    query = f"seed={model_seed}" + (f"&warmup_steps={warmup_steps}" if warmup_steps is not None else "")
    return agent_document(
        agent["name"],
        f"tiny://{agent['preset']}?{query}",
        lr=agent["lr"],
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        micro_batch_size=micro_batch_size,
    )


def experiment(
    name: str,
    agents: list[dict[str, Any]],
    algorithm: dict[str, Any],
    *,
    store_uri: str,
    difficulty: str = "1",
    eval_prompts: int = 200,
    eval_every: int = 0,
    endpoint: str | None = None,
    checkpoint_every: int = 1000,
    eval_split_size: int | None = None,
) -> dict[str, Any]:
    """An HACRLExperiment document on the built-in arithmetic task (metrics endpoints off).
    ``eval_split_size``: generate that many held-out problems (the split's default is 200)."""
    store: dict[str, Any] = {"uri": store_uri}
    if endpoint:
        store["endpoint"] = endpoint
    data: dict[str, Any] = {
        "train": {"source": f"builtin://arithmetic?difficulty={difficulty}&seed=0"},
        "eval": [],
        "reward": "exact",
    }
    if eval_prompts:
        size = f"&size={eval_split_size}" if eval_split_size else ""
        data["eval"] = [
            {
                "name": "arithmetic",
                "source": f"builtin://arithmetic?difficulty={difficulty}&seed=0&split=eval{size}",
                "maxPrompts": eval_prompts,
            }
        ]
    return {
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": name},
        "spec": {
            "agents": agents,
            "algorithm": algorithm,
            "data": data,
            "evaluation": {"everySteps": eval_every},
            "store": store,
            "checkpoint": {"everySteps": checkpoint_every, "keepLast": 1},
            "metrics": {"port": 0},
        },
    }


def write_spec(document: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def bench_env(cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["HACRL_CACHE"] = str(cache)
    env.setdefault("HACRL_WAIT_SECONDS", "900")
    # Idle OpenMP threads sleep instead of spinning: on a shared or oversubscribed CPU, spinning
    # threads slowed the tiny-model warm start 5x here. Same setting for every side of a ratio.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.update(extra or {})
    return env


def hacrl_run(
    spec_path: Path, workdir: Path, env: dict[str, str], *, timeout: float = 3600, args: Sequence[str] = ()
) -> float:
    """`hacrl run --quiet [args]` in a subprocess; returns its wall seconds; raises with the log tail on failure."""
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "run", "--quiet", "--workdir", str(workdir), *args, str(spec_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(spec_path.parent),
        check=False,
    )
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        logs = "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:] for p in sorted((workdir / "logs").glob("*.log"))
        )
        raise RuntimeError(
            f"hacrl run {spec_path} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}\n{logs}"
        )
    return seconds


def build_models(uris: Sequence[str], cache: Path) -> dict[str, float]:
    """Build (or find) every tiny model once, in this process, before any run; seconds per model."""
    os.environ["HACRL_CACHE"] = str(cache)
    from hacrl_core.models.uri import resolve_model

    seconds = {}
    for uri in dict.fromkeys(uris):
        began = time.perf_counter()
        resolve_model(uri, cache / "models")
        seconds[uri] = time.perf_counter() - began
    return seconds


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(mean: float, std: float | None = None, digits: int = 3) -> str:
    if std is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-markdown table (also readable as plain text)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    return "\n".join(
        [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]]
    )


def save(name: str, payload: dict[str, Any], out: Path | None = None) -> Path:
    out = out or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    return path


def now_tag() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S")


class EmulatorApi:
    """Plain JSON over HTTP to the project's API emulator (bench/operator.py, bench/operator_scale.py)."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read() or b"null")
