"""The `hf` engine: a transformers model sampled in batches, one prefill per prompt
(``rollout.decoding``), on CPU or GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hacrl_core.models.encoding import encode_prompt
from hacrl_core.rollout.decoding import sample_with_shared_prefill
from hacrl_core.rollout.engine import Sample, SamplingParams


class HFEngine:
    def __init__(self, batch_size: int = 64, device: str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        self.batch_size = batch_size
        self.device = device
        self.dtype = dtype
        self.model: Any = None
        self.tokenizer: Any = None

    def load(self, model_dir: Path) -> None:
        from hacrl_core.models.loading import load_policy

        self.model, self.tokenizer = load_policy(model_dir, dtype=self.dtype, device=self.device)
        self.model.eval()

    def load_adapter(self, adapter_dir: Path) -> None:
        """Apply a LoRA adapter over the loaded base model through peft: the first adapter wraps
        the base, every later one is loaded into the same modules in place (``models.lora.apply_adapter``)."""
        from hacrl_core.models.lora import apply_adapter

        if self.model is None:
            raise RuntimeError("engine has no base model loaded: call load(model_dir) before load_adapter(adapter_dir)")
        self.model = apply_adapter(self.model, adapter_dir)
        self.model.eval()

    def set_policy(self, model: Any, tokenizer: Any) -> None:
        """Use an already-loaded policy (the learner evaluates its live model this way)."""
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        if self.model is None:
            raise RuntimeError("engine has no weights loaded: call load(model_dir) first")
        tokenizer = self.tokenizer
        eos_id = tokenizer.eos_token_id
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
        generator_seed = params.seed
        results: list[list[Sample]] = []
        was_training = self.model.training
        self.model.eval()
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            encoded = [encode_prompt(tokenizer, p) for p in chunk]
            width = max(len(ids) for ids in encoded)
            # Left padding so every prompt ends where generation starts.
            input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in encoded], device=self.device)
            attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=self.device)
            per_prompt = 1 if params.greedy else params.n
            generator = torch.Generator(device=input_ids.device).manual_seed(generator_seed + start)
            continuation = sample_with_shared_prefill(
                self.model,
                input_ids,
                attention,
                samples_per_prompt=per_prompt,
                max_new_tokens=params.max_new_tokens,
                eos_id=eos_id,
                pad_id=pad_id,
                greedy=params.greedy,
                temperature=params.temperature,
                top_p=params.top_p,
                generator=generator,
            ).tolist()
            for index in range(len(chunk)):
                samples = [
                    self._sample(continuation[index * per_prompt + j], eos_id, pad_id) for j in range(per_prompt)
                ]
                results.append(samples)
        if was_training:
            self.model.train()
        return results

    def _sample(self, ids: list[int], eos_id: int, pad_id: int) -> Sample:
        if eos_id in ids:
            # Keep the eos in the ids: the learner must train the probability of stopping, and a
            # cross learner appends its own eos for a "stop" row (models.encoding.encode_row_for).
            ids = ids[: ids.index(eos_id) + 1]
            return Sample(
                token_ids=ids, text=self.tokenizer.decode(ids[:-1], skip_special_tokens=True), finish_reason="stop"
            )
        # Without eos the sequence ran to max_new_tokens (pad only ever follows an eos).
        return Sample(token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True), finish_reason="length")


def engine_options(settings, lora=None) -> dict[str, Any]:
    """Keyword arguments of ``HFEngine`` from an agent's ``RolloutSettings``: the GPU in bf16
    where there is one (sampling only; the learner re-scores every row), else the CPU in fp32.
    A LoRA adapter needs nothing set up front (``lora`` is unused)."""
    from hacrl_core.models.loading import default_device

    device = default_device()
    return {
        "batch_size": settings.batch_size,
        "device": device,
        "dtype": torch.bfloat16 if device == "cuda" else torch.float32,
    }
