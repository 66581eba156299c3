#!/usr/bin/env bash
# GPU check of the real-model path, on one NVIDIA GPU (docs/real-models.md, "Device check").
#
#   scripts/device-check.sh [OUT_DIR]          # default OUT_DIR: ${OUT:-.hacrl-cache/device-check}
#
# Stages (each timed; a failed stage is reported and the next one still runs):
#   0. environment: GPU, torch, and what it installs: deepspeed and vllm from ./.whl (wheels
#      carried to an offline machine) or from the package index (pip install deepspeed vllm);
#      torch is pinned to the installed version so pip never swaps it;
#   1. tiny models: tiny://llama-char and tiny://qwen2-bpe built locally (no hub needed);
#   2. engine: the `vllm` engine starts on llama-char, samples 64 prompts x 8, reloads other
#      weights in place and samples again: start / generate / reload seconds and tokens/s;
#   3. learner: one HACPO-shaped update through the `deepspeed` backend (ZeRO-2, bf16) on the
#      GPU against the `torch` backend: seconds per update and tokens/s;
#   4. experiment: `hacrl run` of a 2-agent tiny HACPO experiment (vllm + deepspeed, or hf/torch
#      for whatever is missing) for 3 steps; per-stage seconds and tokens/s from its metrics.
# Everything also lands in OUT_DIR/device-check.jsonl. Budget: about 10 minutes on an H200.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
OUT_DIR=${1:-${OUT:-$ROOT/.hacrl-cache/device-check}}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 TOKENIZERS_PARALLELISM=false
export HACRL_CACHE_DIR=${HACRL_CACHE_DIR:-/tmp/hacrl-cache}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$HACRL_CACHE_DIR/torch-extensions}
PY=${PYTHON:-python3}
REPORT="$OUT_DIR/device-check.jsonl"
: > "$REPORT"
stage() {  # stage NAME COMMAND...: run, time, record rc
    local name=$1; shift
    local began=$SECONDS
    echo "=== stage $name"
    "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "{\"stage\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - began))}" | tee -a "$REPORT"
    return 0
}

install() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    local torch_version
    torch_version=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
    echo "torch $torch_version, cuda available: $("$PY" -c 'import torch; print(torch.cuda.is_available())')"
    if [[ -d .whl ]] && ls .whl/*.whl >/dev/null 2>&1; then
        # Offline machine: wheels carried in ./.whl (see docs/real-models.md for the list).
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/hacrl-site .whl/*.whl || return 1
        export PYTHONPATH=/tmp/hacrl-site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
    elif [[ "${HACRL_DEVICE_INSTALL:-auto}" == 0 ]] || ! $PY -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
        echo "no CUDA GPU (or HACRL_DEVICE_INSTALL=0): installing nothing, using what is importable"
    else
        # The torch pin keeps pip from replacing the machine's CUDA torch; a vllm release that
        # needs another torch then fails to install and the run falls back to the hf engine.
        timeout 300 "$PY" -m pip install -q --only-binary=:all: "torch==$torch_version" deepspeed || echo "deepspeed: install failed"
        timeout 300 "$PY" -m pip install -q --only-binary=:all: "torch==$torch_version" vllm || echo "vllm: install failed (each vllm release pins one torch; see docs/real-models.md)"
    fi
    for package in deepspeed vllm hacrl_core; do
        $PY -c "import $package; print('$package', getattr($package, '__version__', 'ok'))" 2>&1 | tail -1
    done
}
stage install install
# install() exports PYTHONPATH inside the stage's subshell pipeline; repeat it for later stages.
if [[ -d /tmp/hacrl-site ]]; then export PYTHONPATH=/tmp/hacrl-site:$ROOT${PYTHONPATH:+:$PYTHONPATH}; else export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}; fi
HAVE_VLLM=$($PY -c 'import vllm' >/dev/null 2>&1 && echo 1 || echo 0)
HAVE_DS=$($PY -c 'import deepspeed' >/dev/null 2>&1 && echo 1 || echo 0)
echo "{\"stage\": \"packages\", \"vllm\": $HAVE_VLLM, \"deepspeed\": $HAVE_DS}" | tee -a "$REPORT"

stage models "$PY" -c "
from hacrl_core.models.tiny import build_tiny_model
for preset in ('llama-char', 'qwen2-bpe'):
    print(preset, build_tiny_model(preset, seed=0, cache_dir='$HACRL_CACHE_DIR/tiny'))
"

if [[ $HAVE_VLLM == 1 ]]; then
stage engine "$PY" - <<PYEOF
import json, time, torch
from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.data.templates import ARITHMETIC_TEMPLATE, render_prompt
from hacrl_core.models.loading import load_policy, save_policy
from hacrl_core.models.tiny import build_tiny_model
from hacrl_core.rollout.engine import SamplingParams, create_engine
first = build_tiny_model("llama-char", seed=0, cache_dir="$HACRL_CACHE_DIR/tiny")
model, tok = load_policy(first)
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.1 * p.std() * torch.randn_like(p))
second = save_policy(model, tok, "$HACRL_CACHE_DIR/weights-2")
prompts = [render_prompt(tok, p.question, ARITHMETIC_TEMPLATE) for _, p in zip(range(64), ArithmeticTask(size=200, seed=1))]
params = SamplingParams(n=8, temperature=1.0, top_p=1.0, max_new_tokens=64, seed=0)
t = time.perf_counter(); engine = create_engine("vllm", tensor_parallel_size=1, gpu_memory_utilization=0.3); engine.load(first); start = time.perf_counter() - t
t = time.perf_counter(); out = engine.generate(prompts, params); gen = time.perf_counter() - t
t = time.perf_counter(); engine.load(second); reload = time.perf_counter() - t
t = time.perf_counter(); out2 = engine.generate(prompts, params); gen2 = time.perf_counter() - t
tokens = sum(len(s.token_ids) for g in out for s in g); tokens2 = sum(len(s.token_ids) for g in out2 for s in g)
print(json.dumps({"stage": "engine-metrics", "seconds_start": start, "seconds_generate": gen, "seconds_reload": reload,
                  "seconds_generate_after_reload": gen2, "tokens_per_second": tokens / gen, "tokens_per_second_after_reload": tokens2 / gen2,
                  "changed": [[s.token_ids for s in g] for g in out] != [[s.token_ids for s in g] for g in out2]}))
PYEOF
grep -h '"engine-metrics"' "$OUT_DIR/engine.log" >> "$REPORT" || true
fi

if [[ $HAVE_DS == 1 ]]; then
stage learner "$PY" - <<PYEOF
import json, time, torch
from hacrl_core.learner.backends import create_backend
from hacrl_core.models.loading import load_policy
from hacrl_core.models.logprobs import sequence_logprobs
from hacrl_core.models.tiny import build_tiny_model
from hacrl_core.spec import LearnerSettings
path = build_tiny_model("llama-char", seed=0, cache_dir="$HACRL_CACHE_DIR/tiny")
rows, length = 256, 96
ids = torch.randint(5, 90, (rows, length), device="cuda"); att = torch.ones_like(ids); resp = torch.zeros_like(ids); resp[:, 32:] = 1
adv = torch.randn(rows, device="cuda")
result = {"stage": "learner-metrics"}
for name, extra in (("torch", {}), ("deepspeed", {"zero_stage": 2})):
    model, _ = load_policy(path, dtype=torch.bfloat16, device="cuda"); model.train()
    backend = create_backend(name, model, LearnerSettings(backend=name, dtype="bfloat16", lr=1e-5, micro_batch_size=64, **extra))
    for repeat in range(3):  # the first update includes warm-up
        torch.cuda.synchronize(); t = time.perf_counter()
        backend.zero_grad()
        for s in range(0, rows, 64):
            logp = sequence_logprobs(backend.model, ids[s:s+64], att[s:s+64], resp[s:s+64])
            loss = -(adv[s:s+64] * (logp.sum(-1) / resp[s:s+64].sum(-1))).mean() * 64 / rows
            backend.backward(loss)
        norm = backend.step(); torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    result[name] = {"seconds_update": seconds, "tokens_per_second": int(resp.sum()) / seconds, "grad_norm": norm}
print(json.dumps(result))
PYEOF
grep -h '"learner-metrics"' "$OUT_DIR/learner.log" >> "$REPORT" || true
fi

ENGINE=$([[ $HAVE_VLLM == 1 ]] && echo vllm || echo hf)
BACKEND=$([[ $HAVE_DS == 1 ]] && echo deepspeed || echo torch)
ZERO=$([[ $HAVE_DS == 1 ]] && echo ", zeroStage: 2" || echo "")
GPU_ROLLOUT=$([[ $HAVE_VLLM == 1 ]] && echo ", gpuMemoryUtilization: 0.25" || echo "")
SPEC="$OUT_DIR/device-check.yaml"
cat > "$SPEC" <<YAML
apiVersion: hacrl.io/v1alpha1
kind: HACRLExperiment
metadata: {name: device-check}
spec:
  agents:
    - name: llama-char
      model: tiny://llama-char?seed=0
      rollout: {engine: $ENGINE, maxNewTokens: 16, batchSize: 256$GPU_ROLLOUT}
      learner: {backend: $BACKEND, lr: 1.0e-4, microBatchSize: 256, dtype: bfloat16$ZERO}
    - name: qwen-bpe
      model: tiny://qwen2-bpe?seed=0
      rollout: {engine: $ENGINE, maxNewTokens: 16, batchSize: 256$GPU_ROLLOUT}
      learner: {backend: $BACKEND, lr: 5.0e-5, microBatchSize: 256, dtype: bfloat16$ZERO}
  algorithm: {name: hacpo, groupSize: 8, promptsPerStep: 128, miniBatchPrompts: 64, steps: 3}
  data:
    train: {source: "builtin://arithmetic?difficulty=1-3&seed=0"}
  store: {uri: "file://$HACRL_CACHE_DIR/runs"}
YAML
rm -rf "$HACRL_CACHE_DIR/runs/device-check"
stage experiment timeout 420 "$PY" -m hacrl_core.cli run "$SPEC" --quiet --workdir "$HACRL_CACHE_DIR/hacrl-runs"
"$PY" - "$HACRL_CACHE_DIR/runs/device-check" <<'PYEOF' | tee -a "$REPORT"
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
for path in sorted(root.glob("steps/*/metrics/*.json")):
    values = json.loads(path.read_text())
    keep = {k: round(v, 3) for k, v in values.items() if isinstance(v, (int, float)) and ("seconds" in k or "tokens_per_second" in k or k.endswith("reward_mean"))}
    print(json.dumps({"stage": "experiment-metrics", "step": path.parts[-3], "agent": path.stem, **keep}))
PYEOF
echo "=== report: $REPORT"
cat "$REPORT"
