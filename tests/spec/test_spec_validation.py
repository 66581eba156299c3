"""The experiment spec: examples validate, bad specs are rejected with the field path named."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hacrl_core.spec import SpecError, dump_experiment, load_experiment, parse_experiment
from tests.support.documents import DELETE, MINIMAL, set_path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def with_change(path: str, value):
    return set_path(copy.deepcopy(MINIMAL), path, value)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates(path):
    experiment = load_experiment(path)
    assert experiment.spec.agents


def test_defaults_are_the_papers():
    algorithm = parse_experiment(MINIMAL).spec.algorithm
    assert (algorithm.name, algorithm.group_size, algorithm.prompts_per_step, algorithm.mini_batch_prompts) == (
        "hacpo",
        8,
        128,
        64,
    )
    assert (algorithm.alpha, algorithm.delta, algorithm.delta_step, algorithm.capability_window) == (1.0, 0.2, 0.025, 5)
    assert algorithm.ratio_bounds == (0.1, 10.0)
    assert (algorithm.own_clip_low, algorithm.own_clip_high) == (3e-4, 4e-4)
    assert algorithm.updates_per_step == 2


def test_rendered_spec_round_trips():
    experiment = parse_experiment(MINIMAL)
    again = parse_experiment(yaml.safe_load(dump_experiment(experiment)))
    assert again == experiment


def test_ablation_switches_map_to_loss_settings():
    document = with_change("spec.algorithm", {"ablations": {"exponentialImportance": False, "stepwiseClipping": False}})
    algorithm = parse_experiment(document).spec.algorithm
    assert algorithm.effective_alpha == 0.0 and algorithm.effective_delta_step == 0.0


BAD_SPECS = [
    ("spec.agents.1.name", "small", "spec.agents[1].name", "duplicate agent name 'small'"),
    ("spec.agents.0.name", "Big_Model", "spec.agents[0].name", "not a valid agent name"),
    ("spec.agents.0.model", "  ", "spec.agents[0].model", "must not be empty"),
    ("spec.agents.0.colour", "red", "spec.agents[0].colour", "unknown field"),
    ("spec.agents", [{"name": "solo", "model": "tiny://llama-char"}], "spec", "needs at least 2 agents"),
    ("spec.agents", [], "spec.agents", "at least 1 item"),
    ("spec.algorithm", {"name": "ppo"}, "spec.algorithm.name", "'hacpo', 'gspo', 'grpo' or 'naive'"),
    ("spec.algorithm", {"groupSize": 1}, "spec.algorithm.groupSize", "greater than or equal to 2"),
    ("spec.algorithm", {"groupSize": "eight"}, "spec.algorithm.groupSize", "valid integer"),
    ("spec.algorithm", {"promptsPerStep": -4}, "spec.algorithm.promptsPerStep", "greater than or equal to 1"),
    ("spec.algorithm", {"steps": 10**12}, "spec.algorithm.steps", "less than or equal to"),
    ("spec.algorithm", {"promptsPerStep": 10, "miniBatchPrompts": 4}, "spec.algorithm", "must divide promptsPerStep"),
    ("spec.algorithm", {"ratioBounds": [2, 10]}, "spec.algorithm.ratioBounds", "0 < low <= 1 <= high"),
    ("spec.algorithm", {"delta": 1.5}, "spec.algorithm.delta", "less than 1"),
    (
        "spec.algorithm",
        {"name": "gspo", "ablations": {"discrepancyCoefficient": False}},
        "spec.algorithm",
        "ablations apply to hacpo only",
    ),
    ("spec.data.reward", "fuzzy", "spec.data.reward", "neither a reward (exact, math, numeric) nor an http(s):// URL"),
    ("spec.data.template", "Solve it.", "spec.data.template", "{question}"),
    ("spec.data.train", DELETE, "spec.data.train", "Field required"),
    ("spec.store", {"uri": "gs://bucket"}, "spec.store.uri", "use file://path or s3://bucket/prefix"),
    ("spec.store", {"uri": "s3://"}, "spec.store.uri", "needs a bucket"),
    ("spec.agents.0.rollout", {"engine": "tgi"}, "spec.agents[0].rollout.engine", "'hf' or 'vllm'"),
    (
        "spec.agents.0.learner",
        {"backend": "deepspeed", "zeroStage": 4},
        "spec.agents[0].learner.zeroStage",
        "0, 1, 2 or 3",
    ),
    (
        "spec.agents.0.learner",
        {"zeroStage": 2},
        "spec.agents[0].learner.zeroStage",
        "applies to backend 'deepspeed' only",
    ),
    (
        "spec.agents.0.learner",
        {"processesPerNode": 0},
        "spec.agents[0].learner.processesPerNode",
        "greater than or equal to 1",
    ),
    ("spec.agents.0.learner", {"processesPerNode": "2"}, "spec.agents[0].learner.processesPerNode", "valid integer"),
    ("spec.agents.0.learner", {"nodes": 0}, "spec.agents[0].learner.nodes", "greater than or equal to 1"),
    ("spec.agents.0.learner", {"nodes": 2000}, "spec.agents[0].learner.nodes", "less than or equal to 1024"),
    (
        "spec.agents.0.rollout",
        {"tensorParallelSize": 2},
        "spec.agents[0].rollout.tensorParallelSize",
        "applies to engine 'vllm' only",
    ),
    ("spec.agents.0.rollout", {"replicas": 0}, "spec.agents[0].rollout.replicas", "greater than or equal to 1"),
    ("spec.agents.0.rollout", {"replicas": 65}, "spec.agents[0].rollout.replicas", "less than or equal to 64"),
    (
        "spec",
        {
            **MINIMAL["spec"],
            "algorithm": {"promptsPerStep": 2, "miniBatchPrompts": 2},
            "agents": [
                {"name": "a", "model": "tiny://llama-char"},
                {"name": "b", "model": "tiny://qwen2-bpe", "rollout": {"replicas": 3}},
            ],
        },
        "spec.agents[1].rollout.replicas",
        "3 replicas for 2 prompts per step (algorithm.promptsPerStep) would leave a replica without a prompt",
    ),
    (
        "spec.agents.0",
        {
            "name": "a",
            "model": "tiny://llama-char",
            "rollout": {"engine": "vllm", "tensorParallelSize": 4},
            "resources": {"rollout": {"limits": {"nvidia.com/gpu": 2}}},
        },
        "spec.agents[0].rollout.tensorParallelSize",
        "4 needs 4 GPUs per rollout replica, but resources.rollout gives 2 (nvidia.com/gpu)",
    ),
    (
        "spec.agents.0",
        {
            "name": "a",
            "model": "tiny://llama-char",
            "rollout": {"engine": "vllm"},
            "resources": {"rollout": {"requests": {"nvidia.com/gpu": "0"}}},
        },
        "spec.agents[0].rollout.tensorParallelSize",
        "1 needs 1 GPUs per rollout replica, but resources.rollout gives 0",
    ),
    (
        "spec.agents.0",
        {
            "name": "a",
            "model": "tiny://llama-char",
            "learner": {"processesPerNode": 4},
            "resources": {"learner": {"limits": {"nvidia.com/gpu": "2"}}},
        },
        "spec.agents[0].learner.processesPerNode",
        "4 ranks need 4 GPUs per learner pod (one each), but resources.learner gives 2 (nvidia.com/gpu)",
    ),
    (
        "spec.scheduling",
        {"queueName": "team-a"},
        "spec.scheduling.queueName",
        "set scheduling.gang to kueue or volcano",
    ),
    ("spec.scheduling", {"gang": "kueue"}, "spec.scheduling.queueName", "gang kueue needs scheduling.queueName"),
    ("spec.scheduling", {"gang": "slurm"}, "spec.scheduling.gang", "'none', 'kueue' or 'volcano'"),
    (
        "spec.scheduling",
        {"gang": "volcano", "schedulerName": "mine"},
        "spec.scheduling.schedulerName",
        "remove scheduling.schedulerName",
    ),
    ("spec.scheduling", {"gang": "kueue", "queueName": "Team A"}, "spec.scheduling.queueName", "is not a queue name"),
    (
        "spec.scheduling",
        {"pendingTimeoutSeconds": -1},
        "spec.scheduling.pendingTimeoutSeconds",
        "greater than or equal to 0",
    ),
    ("spec.colocate", "yes please", "spec.colocate", "valid boolean"),
    (
        "spec",
        {**MINIMAL["spec"], "colocate": True, "algorithm": {"maxStaleness": 1}},
        "spec.colocate",
        "cannot be true with algorithm.maxStaleness: 1",
    ),
    (
        "spec",
        {
            **MINIMAL["spec"],
            "colocate": True,
            "agents": [
                {"name": "a", "model": "tiny://llama-char", "rollout": {"engine": "vllm"}},
                {"name": "b", "model": "tiny://qwen2-bpe"},
            ],
        },
        "spec.colocate",
        "agents[0].rollout.engine: vllm (a colocated worker samples with transformers; set it to hf)",
    ),
    (
        "spec",
        {
            **MINIMAL["spec"],
            "colocate": True,
            "agents": [
                {"name": "a", "model": "tiny://llama-char", "rollout": {"replicas": 2}},
                {"name": "b", "model": "tiny://qwen2-bpe"},
            ],
        },
        "spec.colocate",
        "agents[0].rollout.replicas: 2 (a colocated worker is one sampler per agent; set it to 1)",
    ),
    ("spec.agents.0.learner", {"lora": {"rank": 0}}, "spec.agents[0].learner.lora.rank", "greater than or equal to 1"),
    (
        "spec.agents.0.learner",
        {"lora": {"rank": 1024}},
        "spec.agents[0].learner.lora.rank",
        "less than or equal to 512",
    ),
    ("spec.agents.0.learner", {"lora": {"alpha": 0}}, "spec.agents[0].learner.lora.alpha", "greater than 0"),
    ("spec.agents.0.learner", {"lora": {"dropout": 1.0}}, "spec.agents[0].learner.lora.dropout", "less than 1"),
    (
        "spec.agents.0.learner",
        {"lora": {"targetModules": []}},
        "spec.agents[0].learner.lora.targetModules",
        "at least 1 item",
    ),
    (
        "spec.agents.0.learner",
        {"lora": {"targetModules": ["q-proj"]}},
        "spec.agents[0].learner.lora.targetModules[0]",
        "'q-proj' is not a module name",
    ),
    (
        "spec.agents.0.learner",
        {"lora": {"targetModules": ["q_proj", "v_proj", "q_proj"]}},
        "spec.agents[0].learner.lora.targetModules",
        "lists a module twice ('q_proj'); list each once",
    ),
    ("spec.agents.0.learner", {"lora": {"ranks": 8}}, "spec.agents[0].learner.lora.ranks", "unknown field"),
    ("metadata.name", "My Experiment", "metadata.name", "not a valid experiment name"),
    ("kind", "RayJob", "kind", "'HACRLExperiment'"),
]


@pytest.mark.parametrize("path, value, field, message", BAD_SPECS, ids=[b[2] + ":" + b[3][:20] for b in BAD_SPECS])
def test_bad_spec_is_rejected_with_field_path(path, value, field, message):
    with pytest.raises(SpecError) as caught:
        parse_experiment(with_change(path, value), "bad.yaml")
    lines = [line for line in caught.value.errors if line.startswith(field + ":")]
    assert lines, f"no error names {field}: {caught.value.errors}"
    assert any(message in line for line in lines), caught.value.errors


def test_not_a_mapping_is_rejected():
    with pytest.raises(SpecError, match="expected a mapping"):
        parse_experiment(["agents"])


def test_hacrl_validate_cli_reports_every_problem(tmp_path):
    bad = with_change("spec.algorithm", {"groupSize": 1, "delta": 2})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "validate", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "spec.algorithm.groupSize" in result.stderr and "spec.algorithm.delta" in result.stderr
    good = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "validate", str(EXAMPLES[0])], capture_output=True, text=True
    )
    assert good.returncode == 0, good.stderr
    assert ": ok" in good.stdout


# -- model plumbing: env, envFrom, model cache (issue 15 item 4) ----------------------------------


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("HF_HOME", "the operator sets it"),
        ("HACRL_AGENT", "the operator sets it"),
        ("POD_NAME", "the operator sets it"),
        ("HF_TOKEN", "use spec.modelTokenSecret"),
        ("AWS_SECRET_ACCESS_KEY", "use spec.store"),
    ],
)
def test_env_refuses_what_the_operator_sets_naming_the_field(name, fix):
    document = with_change("spec.env", [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": name, "value": "x"}])
    with pytest.raises(SpecError) as error:
        parse_experiment(document)
    (line,) = error.value.errors
    assert line.startswith(f"spec.env[1].name: {name!r} is set by the operator") and fix in line


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            "spec.env",
            [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
            "spec.env[1].name: duplicate variable 'A'",
        ),
        ("spec.env", [{"name": "1A", "value": "1"}], "spec.env[0].name: "),
        (
            "spec.env",
            [{"name": "A", "value": "1", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
            "give value or valueFrom, not both",
        ),
        (
            "spec.env",
            [{"name": "A", "valueFrom": {}}],
            "valueFrom takes exactly one of configMapKeyRef and secretKeyRef",
        ),
        (
            "spec.env",
            [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "Not_A_Name", "key": "k"}}}],
            "spec.env[0].valueFrom.secretKeyRef.name",
        ),
        (
            "spec.envFrom",
            [{"configMapRef": {"name": "c"}, "secretRef": {"name": "s"}}],
            "each envFrom entry takes exactly one",
        ),
        ("spec.envFrom", [{"configMapRef": {"name": "c"}, "prefix": "1X"}], "spec.envFrom[0].prefix"),
        (
            "spec.modelCache",
            {"claimName": "Models!"},
            "spec.modelCache.claimName: 'Models!' is not a PersistentVolumeClaim name",
        ),
        ("spec.modelCache", {"claimName": "m", "mountPath": "/x"}, "spec.modelCache.mountPath: unknown field"),
    ],
)
def test_bad_env_env_from_and_model_cache_are_refused(path, value, expected):
    with pytest.raises(SpecError) as error:
        parse_experiment(with_change(path, value))
    assert any(expected in line for line in error.value.errors), error.value.errors


def test_secrets_named_by_env_and_env_from_go_through_the_approval():
    document = with_change(
        "spec.env",
        [
            {"name": "A", "value": "1"},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "b"}}},
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
        ],
    )
    document = set_path(
        document,
        "spec.envFrom",
        [{"configMapRef": {"name": "tuning"}}, {"secretRef": {"name": "extra"}, "prefix": "X_"}],
    )
    document = set_path(document, "spec.modelTokenSecret", "hf-token")
    assert parse_experiment(document).spec.secret_references() == [
        ("spec.modelTokenSecret", "hf-token"),
        ("spec.env[2].valueFrom.secretKeyRef", "wandb"),
        ("spec.envFrom[1].secretRef", "extra"),
    ]


def test_an_agents_model_cache_overrides_the_experiments():
    spec = parse_experiment(with_change("spec.agents.1.modelCache", {"claimName": "big-models"})).spec
    assert spec.model_cache_of("small") is None and spec.model_cache_of("big").claim_name == "big-models"
    spec = parse_experiment(
        set_path(
            with_change("spec.agents.1.modelCache", {"claimName": "big-models"}),
            "spec.modelCache",
            {"claimName": "models"},
        )
    ).spec
    assert spec.model_cache_of("small").claim_name == "models" and spec.model_cache_of("big").claim_name == "big-models"


@pytest.mark.parametrize(
    "colocate, staleness, engine, local, operator",
    [
        (None, 0, "hf", True, False),  # omitted: `hacrl run` colocates, the operator splits
        (None, 1, "hf", False, False),  # off-policy sampling needs a separate rollout worker
        (None, 0, "vllm", False, False),  # so does vLLM
        (True, 0, "hf", True, True),  # asked for: everywhere
        (False, 0, "hf", False, False),
    ],
)
def test_where_agents_run_colocated(colocate, staleness, engine, local, operator):
    document = with_change("spec.algorithm", {"maxStaleness": staleness})
    document["spec"]["agents"][0]["rollout"] = {"engine": engine}
    if colocate is not None:
        document["spec"]["colocate"] = colocate
    spec = parse_experiment(document, "demo.yaml").spec
    assert spec.runs_colocated(by_default=True) is local
    assert spec.runs_colocated(by_default=False) is operator


def test_pure_bf16_torch_learners_are_warned_about_naming_the_field(tmp_path):
    document = with_change("spec.agents.1.learner", {"backend": "torch", "dtype": "bfloat16", "lr": 1e-6})
    assert parse_experiment(document).spec.warnings() == [
        "agents[1].learner: backend torch with dtype bfloat16 keeps no fp32 master weights, so AdamW steps smaller than "
        "about |w|/256 round away (at lr 1e-06 most do); use backend: deepspeed (fp32 master weights) or dtype: float32"
    ]
    assert (
        parse_experiment(with_change("spec.agents.1.learner", {"backend": "torch", "dtype": "float32"})).spec.warnings()
        == []
    )
    # peft keeps a LoRA adapter in float32 over the bfloat16 base: nothing rounds away
    lora = with_change("spec.agents.1.learner", {"backend": "torch", "dtype": "bfloat16", "lora": {"rank": 8}})
    assert parse_experiment(lora).spec.warnings() == []
    path = tmp_path / "bf16.yaml"
    path.write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "validate", str(path)], capture_output=True, text=True
    )
    assert (
        result.returncode == 0 and "warning: spec.agents[1].learner: backend torch with dtype bfloat16" in result.stdout
    )
