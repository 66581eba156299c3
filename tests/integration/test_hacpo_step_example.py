"""examples/hacpo_step.py, the one-file HACPO walk-through, runs as documented on fresh tiny models."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_one_file_hacpo_example_trains_both_agents_on_each_others_rows(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "hacpo_step.py"),
            "--steps",
            "2",
            "--prompts",
            "4",
            "--warmup-steps",
            "0",
            "--cache",
            str(tmp_path / "cache"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = re.findall(r"^step (\d) +(\S+): reward ([\d.]+) +rows (\d+) own \+ (\d+) shared", done.stdout, re.MULTILINE)
    assert [(step, agent) for step, agent, *_ in lines] == [
        ("0", "llama-char"),
        ("0", "qwen-bpe"),
        ("1", "llama-char"),
        ("1", "qwen-bpe"),
    ], done.stdout
    for *_, reward, own, shared in lines:
        assert 0.0 <= float(reward) <= 1.0
        assert (own, shared) == ("32", "32")  # 4 prompts x G 8 of its own, and the peer's 32
    assert not (tmp_path / "unused").exists(), "the in-memory example must not write a store"
