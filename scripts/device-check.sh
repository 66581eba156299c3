#!/usr/bin/env bash
# GPU check of the real-model path, on one or more NVIDIA GPUs (docs/real-models.md, "Device check").
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
#   4. multirank (2 or more GPUs only): tests/learner/rank_job.py at 1 and 2 ranks over NCCL, torch
#      backend and deepspeed ZeRO-2/3: the 2 ranks take the 1-rank update, checkpoints restore;
#   5. experiment: `hacrl run` of a 2-agent tiny HACPO experiment (vllm + deepspeed, or hf/torch
#      for whatever is missing) for 3 steps; per-stage seconds and tokens/s from its metrics;
#   6. experiment-2rank (2 or more GPUs only): the same with every learner on 2 ranks
#      (processesPerNode: 2, NCCL) for 2 steps.
# With fewer than 2 GPUs, stages 4 and 6 print that they are skipped (not a failure).
# Everything also lands in OUT_DIR/device-check.jsonl. Budget: about 10 minutes on one H200; the
# 2-rank stages add an estimated 5-10 minutes (never run yet).
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

# Learner ranks: only with 2 or more GPUs (one GPU per rank, NCCL); a machine with fewer skips
# the 2-rank stages with a line saying so, which is not a failure.
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
[[ $GPUS =~ ^[0-9]+$ ]] || GPUS=0
echo "{\"stage\": \"gpus\", \"count\": $GPUS}" | tee -a "$REPORT"
skip_two_ranks() {  # skip_two_ranks STAGE: say why STAGE does not run here, in the log and the report
    echo "=== stage $1: skipped: $GPUS GPU(s) visible, a 2-rank learner needs 2 or more"
    echo "{\"stage\": \"$1\", \"skipped\": \"$GPUS GPU(s) visible, a 2-rank learner needs 2 or more\"}" | tee -a "$REPORT"
}

if (( GPUS >= 2 )); then
# The multi-rank learner tests' job (tests/learner/rank_job.py: the learner worker's own functions on
# a fixed step of 16 rows) at 1 and at 2 ranks: the 2 ranks must take the 1-rank update (the
# tolerances of tests/learner/test_learner_multirank.py), and a checkpoint must restore at the other rank
# count (torch) or resume at its own (deepspeed ZeRO-2 and ZeRO-3, whose checkpoint gathers every
# rank's optimizer shard to rank 0 over NCCL). Each case: seconds at 1 and 2 ranks.
stage multirank timeout 600 "$PY" - "$HAVE_DS" <<PYEOF
import json, shutil, subprocess, sys, time
from pathlib import Path
from safetensors.torch import load_file
from hacrl_core.models.loading import load_policy
from hacrl_core.models.tiny import build_tiny_model
root = Path("$HACRL_CACHE_DIR/multirank")
shutil.rmtree(root, ignore_errors=True)
root.mkdir(parents=True)
job = "$ROOT/tests/learner/rank_job.py"
sys.path.insert(0, str(Path(job).parent))
from rank_job import update_difference  # test_multirank's tolerances, as numbers
launch = "import sys; from hacrl_core.learner.launcher import launch_local_ranks; sys.exit(launch_local_ranks(sys.argv[2:], int(sys.argv[1])))"
model = build_tiny_model("llama-char", seed=0, warmup_steps=0, cache_dir=root / "tiny")
start = {name: tensor.detach().clone() for name, tensor in load_policy(model)[0].state_dict().items()}

def run(tag, ranks, store, steps, extra=(), checkpoint=None):
    out = root / f"{tag}.st"
    command = [sys.executable, job, "--model", str(model), "--store", (root / store).as_uri(), "--work", str(root / f"work-{tag}"),
               "--steps", *map(str, steps), "--out", str(out), *extra] + (["--checkpoint", str(checkpoint)] if checkpoint else [])
    if ranks > 1:
        command = [sys.executable, "-c", launch, str(ranks), *command]
    began = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        print(result.stdout[-2000:] + result.stderr[-4000:])
        raise SystemExit(f"{tag}: {ranks} rank(s) exited with {result.returncode}")
    metrics = json.loads(out.with_suffix(".json").read_text())
    return {"weights": load_file(out), "metrics": metrics, "seconds": round(time.perf_counter() - began, 1)}

def norm(result, step):
    return result["metrics"][str(step)]["learner/grad_norm"]

report, ok = {"stage": "multirank-metrics"}, True
one = run("torch-1", 1, "torch-1", [0], checkpoint=1)
two = run("torch-2", 2, "torch-2", [0], checkpoint=1)
case = update_difference(two["weights"], one["weights"], start)
case.update(seconds_1rank=one["seconds"], seconds_2ranks=two["seconds"], grad_norm_1rank=norm(one, 0), grad_norm_2ranks=norm(two, 0))
case["ok"] = case["ok"] and abs(norm(two, 0) - norm(one, 0)) <= 1e-4 * abs(norm(one, 0))
reference = run("torch-1to1", 1, "torch-1", [1])["weights"]
for saved, restored in ((2, 1), (1, 2)):
    check = update_difference(run(f"torch-{saved}to{restored}", restored, f"torch-{saved}", [1])["weights"], reference, one["weights"])
    case[f"restore_{saved}_ranks_at_{restored}"] = check
    case["ok"] = case["ok"] and check["ok"]
report["torch"] = case
ok = ok and case["ok"]
if sys.argv[1] == "1":
    for zero in (2, 3):  # the rows slice unevenly over the ranks: ZeRO 2/3 must still run in lockstep
        flags = ["--deepspeed-zero", str(zero), "--uneven"]
        one = run(f"zero{zero}-1", 1, f"zero{zero}-1", [0], flags, checkpoint=1)
        two = run(f"zero{zero}-2", 2, f"zero{zero}-2", [0], flags, checkpoint=1)
        case = update_difference(two["weights"], one["weights"], start)
        case.update(seconds_1rank=one["seconds"], seconds_2ranks=two["seconds"], grad_norm_1rank=norm(one, 0), grad_norm_2ranks=norm(two, 0))
        case["ok"] = case["ok"] and abs(norm(two, 0) - norm(one, 0)) <= 1e-4 * abs(norm(one, 0))
        resumed = update_difference(run(f"zero{zero}-2to2", 2, f"zero{zero}-2", [1], flags)["weights"],
                                    run(f"zero{zero}-1to1", 1, f"zero{zero}-1", [1], flags)["weights"], one["weights"])
        case["resume_at_2_ranks"] = resumed
        case["ok"] = case["ok"] and resumed["ok"]
        report[f"deepspeed_zero{zero}"] = case
        ok = ok and case["ok"]
report["ok"] = ok
print(json.dumps(report))
sys.exit(0 if ok else 1)
PYEOF
grep -h '"multirank-metrics"' "$OUT_DIR/multirank.log" >> "$REPORT" || true
else
skip_two_ranks multirank
fi

ENGINE=$([[ $HAVE_VLLM == 1 ]] && echo vllm || echo hf)
BACKEND=$([[ $HAVE_DS == 1 ]] && echo deepspeed || echo torch)
ZERO=$([[ $HAVE_DS == 1 ]] && echo ", zeroStage: 2" || echo "")
GPU_ROLLOUT=$([[ $HAVE_VLLM == 1 ]] && echo ", gpuMemoryUtilization: 0.25" || echo "")
write_spec() {  # write_spec NAME STEPS RANKS: the tiny 2-agent experiment, each learner with RANKS ranks
    local name=$1 steps=$2 ranks=$3 extra=""
    (( ranks > 1 )) && extra=", processesPerNode: $ranks"
    cat > "$OUT_DIR/$name.yaml" <<YAML
apiVersion: hacrl.io/v1alpha1
kind: HACRLExperiment
metadata: {name: $name}
spec:
  agents:
    - name: llama-char
      model: tiny://llama-char?seed=0
      rollout: {engine: $ENGINE, maxNewTokens: 16, batchSize: 256$GPU_ROLLOUT}
      learner: {backend: $BACKEND, lr: 1.0e-4, microBatchSize: 256, dtype: bfloat16$ZERO$extra}
    - name: qwen-bpe
      model: tiny://qwen2-bpe?seed=0
      rollout: {engine: $ENGINE, maxNewTokens: 16, batchSize: 256$GPU_ROLLOUT}
      learner: {backend: $BACKEND, lr: 5.0e-5, microBatchSize: 256, dtype: bfloat16$ZERO$extra}
  algorithm: {name: hacpo, groupSize: 8, promptsPerStep: 128, miniBatchPrompts: 64, steps: $steps}
  data:
    train: {source: "builtin://arithmetic?difficulty=1-3&seed=0"}
  store: {uri: "file://$HACRL_CACHE_DIR/runs"}
YAML
    rm -rf "${HACRL_CACHE_DIR:?}/runs/$name"
}
experiment_metrics() {  # experiment_metrics NAME: per step and agent, seconds, tokens/s and reward from the store
    "$PY" - "$HACRL_CACHE_DIR/runs/$1" "$1" <<'PYEOF' | tee -a "$REPORT"
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
stage = "experiment-metrics" if sys.argv[2] == "device-check" else f"{sys.argv[2]}-metrics"
for path in sorted(root.glob("steps/*/metrics/*.json")):
    if path.name.endswith(".commit.json"):  # the store's commit markers beside each shard
        continue
    values = json.loads(path.read_text())
    keep = {k: round(v, 3) for k, v in values.items() if isinstance(v, (int, float)) and ("seconds" in k or "tokens_per_second" in k or k.endswith("reward_mean"))}
    print(json.dumps({"stage": stage, "step": path.parts[-3], "agent": path.stem, **keep}))
PYEOF
}

write_spec device-check 3 1
SPEC="$OUT_DIR/device-check.yaml"
stage experiment timeout 420 "$PY" -m hacrl_core.cli run "$SPEC" --quiet --workdir "$HACRL_CACHE_DIR/hacrl-runs"
experiment_metrics device-check

if (( GPUS >= 2 )); then
# The same experiment with every learner on 2 ranks (processesPerNode: 2, NCCL), through `hacrl run`:
# the ranks of each agent train on cuda:0 and cuda:1, rank 0 alone writes to the store.
write_spec device-check-2rank 2 2
stage experiment-2rank timeout 420 "$PY" -m hacrl_core.cli run "$OUT_DIR/device-check-2rank.yaml" --quiet --workdir "$HACRL_CACHE_DIR/hacrl-runs-2rank"
joined=$(cat "$HACRL_CACHE_DIR"/hacrl-runs-2rank/logs/*.log 2>/dev/null | grep -c "learner rank 1 of 2 joined (nccl")
echo "{\"stage\": \"experiment-2rank-ranks\", \"nccl_rank1_joined\": $joined, \"want\": 2}" | tee -a "$REPORT"
experiment_metrics device-check-2rank
else
skip_two_ranks experiment-2rank
fi
echo "=== report: $REPORT"
cat "$REPORT"
