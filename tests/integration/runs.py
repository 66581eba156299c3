"""Helpers for end-to-end runs: tiny specs, `hacrl run` subprocesses, store inspection."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def tiny_spec(
    name: str,
    store_uri: str,
    *,
    algorithm: str = "hacpo",
    steps: int = 3,
    endpoint: str | None = None,
    extra_algorithm: dict | None = None,
    colocate: bool | None = None,
) -> dict:
    """Two heterogeneous tiny agents with a short warm start: a few seconds per step on CPU.
    ``colocate`` None leaves the choice to `hacrl run` (colocated, as a user gets it); tests that
    hold or kill a rollout or learner worker by name set False."""
    document = {
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": name},
        "spec": {
            "agents": [
                {
                    "name": "llama",
                    "model": "tiny://llama-char?seed=0&warmup_steps=40",
                    "rollout": {"maxNewTokens": 6},
                    "learner": {"lr": 1e-4},
                },
                {
                    "name": "qwen",
                    "model": "tiny://qwen2-bpe?seed=0&warmup_steps=40",
                    "rollout": {"maxNewTokens": 6},
                    "learner": {"lr": 1e-4},
                },
            ],
            "algorithm": {
                "name": algorithm,
                "groupSize": 4,
                "promptsPerStep": 4,
                "miniBatchPrompts": 2,
                "steps": steps,
                **(extra_algorithm or {}),
            },
            "data": {
                "train": {"source": "builtin://arithmetic?difficulty=1-2&seed=0"},
                "eval": [
                    {
                        "name": "arith",
                        "source": "builtin://arithmetic?difficulty=1-2&seed=0&split=eval",
                        "maxPrompts": 8,
                    }
                ],
                "reward": "exact",
            },
            "store": {"uri": store_uri, **({"endpoint": endpoint} if endpoint else {})},
            "checkpoint": {"everySteps": 1, "keepLast": 2},
            "metrics": {"port": 0},
            **({"colocate": colocate} if colocate is not None else {}),
        },
    }
    return document


def write_spec(directory: Path, document: dict) -> Path:
    path = directory / f"{document['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run_env(cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["HACRL_CACHE"] = str(cache)
    env["HACRL_WAIT_SECONDS"] = "300"
    env.update(extra or {})
    return env


def start_run(spec: Path, cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hacrl_core.cli", "run", str(spec), "--workdir", str(cwd / "work"), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
