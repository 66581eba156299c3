"""The CRD's admission-time checks, evaluated on the generated CRD itself: the CEL rules
(x-kubernetes-validations, run with cel-python at the schema location the API server runs them),
the name patterns and limits (JSON Schema), and the schema defaults. Each rule is checked to
refuse what the spec's Python validators refuse, so `kubectl apply` and `hacrl validate` agree.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from hacrl_core.crd import build_crd
from hacrl_core.spec import SpecError, dump_experiment, parse_experiment
from tests.support.crd_schema import openapi_to_jsonschema, rules

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def values_at(document: Any, path: tuple[str, ...]) -> list[Any]:
    if not path:
        return [document]
    head, *rest = path
    if head == "*":
        return [v for item in (document or []) for v in values_at(item, tuple(rest))]
    if not isinstance(document, dict) or head not in document:
        return []  # the API server runs a rule only where its value exists
    return values_at(document[head], tuple(rest))


def violations(document: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Messages of every CEL rule of the CRD that refuses ``document`` (an update of ``old``)."""
    env = celpy.Environment()
    failed = []
    for path, rule in rules(SCHEMA):
        transition = "oldSelf" in rule["rule"]
        if transition and old is None:
            continue  # transition rules run on updates only
        if transition and path:
            raise AssertionError("this harness pairs old and new values only at the root")
        program = env.program(env.compile(rule["rule"]))
        for value in values_at(document, path):
            activation = {"self": celpy.json_to_cel(value)}
            if transition:
                activation["oldSelf"] = celpy.json_to_cel(old)
            result = program.evaluate(activation)
            if isinstance(result, celpy.CELEvalError) or not bool(result):
                failed.append(rule["message"])
    return failed


def python_refuses(document: dict[str, Any]) -> bool:
    try:
        parse_experiment(document)
    except SpecError:
        return True
    return False


def changed(path: str, value: Any, document: dict[str, Any] | None = None) -> dict[str, Any]:
    document = copy.deepcopy(document or QUICKSTART)
    *parents, last = path.split(".")
    node = document
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
    return document


def test_the_quickstart_passes_every_rule() -> None:
    assert violations(QUICKSTART) == []
    assert violations(QUICKSTART, old=QUICKSTART) == []


@pytest.mark.parametrize(
    ("case", "document", "message"),
    [
        (
            "mini-batch-does-not-divide",
            changed("spec.algorithm.miniBatchPrompts", 5),
            "miniBatchPrompts must divide promptsPerStep",
        ),
        (
            "mini-batch-larger",
            changed("spec.algorithm.miniBatchPrompts", 1024),
            "miniBatchPrompts must divide promptsPerStep",
        ),
        ("ratio-bounds", changed("spec.algorithm.ratioBounds", [1.5, 10.0]), "ratioBounds must be [low, high]"),
        ("hacpo-alone", changed("spec.agents", QUICKSTART["spec"]["agents"][:1]), "need at least 2 agents"),
        ("name-upper-case", changed("metadata.name", "Quick_Start"), "metadata.name must be a DNS label"),
        ("name-too-long", changed("metadata.name", "q" * 41), "metadata.name must be a DNS label"),
        (
            "queue-without-gang",
            changed("spec.scheduling", {"queueName": "team-a"}),
            "set scheduling.gang to kueue or volcano",
        ),
        (
            "kueue-without-queue",
            changed("spec.scheduling", {"gang": "kueue"}),
            "scheduling.gang kueue needs scheduling.queueName",
        ),
        (
            "volcano-other-scheduler",
            changed("spec.scheduling", {"gang": "volcano", "schedulerName": "my-scheduler"}),
            "scheduling.gang volcano schedules the pods with schedulerName volcano",
        ),
        (
            "env-value-and-value-from",
            changed(
                "spec.env", [{"name": "A", "value": "1", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
            ),
            "give value or valueFrom, not both",
        ),
        (
            "env-value-from-both-refs",
            changed(
                "spec.env",
                [
                    {
                        "name": "A",
                        "valueFrom": {
                            "configMapKeyRef": {"name": "c", "key": "k"},
                            "secretKeyRef": {"name": "s", "key": "k"},
                        },
                    }
                ],
            ),
            "valueFrom takes exactly one of configMapKeyRef and secretKeyRef",
        ),
        ("env-value-from-empty", changed("spec.env", [{"name": "A", "valueFrom": {}}]), "valueFrom takes exactly one"),
        ("env-operator-variable", changed("spec.env", [{"name": "HF_HOME", "value": "/x"}]), "are set by the operator"),
        (
            "env-operator-prefix",
            changed("spec.env", [{"name": "HACRL_AGENT", "value": "x"}]),
            "are set by the operator",
        ),
        (
            "env-token-by-hand",
            changed(
                "spec.env", [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}}]
            ),
            "HF_TOKEN: spec.modelTokenSecret",
        ),
        (
            "env-from-both",
            changed("spec.envFrom", [{"configMapRef": {"name": "c"}, "secretRef": {"name": "s"}}]),
            "each entry takes exactly one of configMapRef and secretRef",
        ),
        ("env-from-neither", changed("spec.envFrom", [{"prefix": "X_"}]), "each entry takes exactly one"),
        (
            "colocate-stale",
            changed("spec.algorithm.maxStaleness", 1, changed("spec.colocate", True)),
            "colocate: true needs algorithm.maxStaleness 0",
        ),
        (
            "colocate-vllm",
            changed("spec.agents.1.rollout.engine", "vllm", changed("spec.colocate", True)),
            "every agent's rollout.engine hf",
        ),
        (
            "colocate-replicas",
            changed("spec.agents.1.rollout.replicas", 2, changed("spec.colocate", True)),
            "and rollout.replicas 1",
        ),
        (
            "lora-module-twice",
            changed("spec.agents.0.learner", {"lora": {"targetModules": ["q_proj", "q_proj"]}}),
            "lora.targetModules lists a module twice",
        ),
        (
            "replicas-above-prompts",
            changed("spec.agents.0.rollout.replicas", 9, changed("spec.algorithm.promptsPerStep", 8)),
            "rollout.replicas must be at most algorithm.promptsPerStep",
        ),
    ],
)
def test_cross_field_rules_refuse_what_the_spec_refuses(case: str, document: dict[str, Any], message: str) -> None:
    found = violations(document)
    assert any(message in m for m in found), found
    assert python_refuses(document), f"{case}: the CRD refuses what `hacrl validate` accepts"


@pytest.mark.parametrize(
    "scheduling",
    [
        {"gang": "kueue", "queueName": "team-a"},
        {"gang": "volcano"},
        {"gang": "volcano", "queueName": "research", "schedulerName": "volcano"},
        {"gang": "none", "pendingTimeoutSeconds": 0},
    ],
)
def test_gang_settings_both_accept(scheduling: dict[str, Any]) -> None:
    document = changed("spec.scheduling", scheduling)
    assert violations(document) == [] and not python_refuses(document)


@pytest.mark.parametrize("colocate", [True, False])
def test_colocation_both_accept_where_it_can_run(colocate: bool) -> None:
    document = changed("spec.colocate", colocate)
    assert violations(document) == [] and not python_refuses(document)
    # Asking for split workers is always allowed, whatever the staleness and engines.
    document = changed("spec.algorithm.maxStaleness", 1, changed("spec.colocate", False))
    assert violations(document) == [] and not python_refuses(document)


def test_env_env_from_and_model_cache_both_accept() -> None:
    document = changed(
        "spec.env",
        [
            {"name": "HF_HUB_ENABLE_HF_TRANSFER", "value": "1"},
            {"name": "NCCL_DEBUG", "value": "WARN"},
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
            {"name": "PROXY", "valueFrom": {"configMapKeyRef": {"name": "net", "key": "proxy", "optional": True}}},
        ],
    )
    document = changed(
        "spec.envFrom",
        [{"configMapRef": {"name": "tuning"}}, {"secretRef": {"name": "extra"}, "prefix": "X_"}],
        document,
    )
    document = changed("spec.modelCache", {"claimName": "models"}, document)
    document = changed("spec.agents.0.modelCache", {"claimName": "models-a"}, document)
    assert violations(document) == [] and not python_refuses(document)


def test_lora_settings_both_accept() -> None:
    document = changed(
        "spec.agents.0.learner",
        {"lora": {"rank": 8, "alpha": 16, "dropout": 0.05, "targetModules": ["q_proj", "self_attn.v_proj"]}},
    )
    document = changed("spec.agents.1.learner", {"lora": {}}, document)
    assert violations(document) == [] and not python_refuses(document)


def test_a_single_isolated_agent_is_fine() -> None:
    document = changed("spec.algorithm.name", "gspo", changed("spec.agents", QUICKSTART["spec"]["agents"][:1]))
    assert violations(document) == [] and not python_refuses(document)


def started(document: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(document), "status": {"phase": "Running", "startTime": "2026-12-03T10:00:00Z"}}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("spec.algorithm.steps", 99, "spec.algorithm cannot change"),
        ("spec.agents.0.model", "tiny://llama-char?seed=1", "spec.agents[].model of an existing agent cannot change"),
        ("spec.data.train.source", "builtin://arithmetic?difficulty=4-5", "spec.data cannot change"),
    ],
)
def test_agents_algorithm_and_data_are_immutable_once_started(field: str, value: Any, message: str) -> None:
    old = started(QUICKSTART)
    new = changed(field, value, old)
    assert any(message in m for m in violations(new, old=old))
    pending = copy.deepcopy(QUICKSTART)  # before the pods were first created, a fix in place is fine
    assert violations(changed(field, value, pending), old=pending) == []


def test_rollout_replicas_are_fixed_once_started() -> None:
    """A step's prompts are sliced by rollout.replicas: changing it mid-run (even over a suspend)
    would mix parts sliced two ways in one step."""
    message = "spec.agents[].rollout.replicas of an existing agent cannot change once the experiment started"
    old = started(QUICKSTART)
    for replicas, before in ((2, old), (1, changed("spec.agents.0.rollout.replicas", 3, old))):
        assert any(
            message in m for m in violations(changed("spec.agents.0.rollout.replicas", replicas, before), old=before)
        )
    assert violations(changed("spec.agents.0.rollout.replicas", 1, old), old=old) == []  # 1 is the default: no change
    suspended = changed("spec.suspend", True, old)
    assert any(message in m for m in violations(changed("spec.agents.1.rollout.replicas", 2, suspended), old=suspended))
    pending = copy.deepcopy(QUICKSTART)  # before the pods were first created, it may be set in place
    assert violations(changed("spec.agents.0.rollout.replicas", 4, pending), old=pending) == []


def test_agents_may_join_leave_and_pause_while_running() -> None:
    """Issue 41: the team may change once started (the steps' members are recorded in the store);
    an existing agent's model (its tokenizer with it) may not."""
    old = started(QUICKSTART)
    agents = QUICKSTART["spec"]["agents"]
    newcomer = {"name": "newcomer", "model": "tiny://qwen2-bpe?seed=7"}
    joined = changed("spec.agents", [*agents, newcomer], old)
    assert violations(joined, old=old) == [] and not python_refuses(joined)
    left = changed("spec.agents", [agents[0], newcomer], joined)
    assert violations(left, old=joined) == [] and not python_refuses(left)
    renamed = changed("spec.agents.1.name", "renamed", old)  # one agent left, another joined
    assert violations(renamed, old=old) == []
    paused = changed("spec.agents.1.suspend", True, old)
    assert violations(paused, old=old) == [] and not python_refuses(paused)
    assert violations(changed("spec.agents.1.suspend", False, paused), old=paused) == []
    moved = changed("spec.agents", [*agents[::-1]], old)  # order is not identity: names are
    assert violations(moved, old=old) == []
    swapped = changed("spec.agents.1.model", agents[0]["model"], joined)
    assert any("spec.agents[].model of an existing agent cannot change" in m for m in violations(swapped, old=old))
    every = changed("spec.agents.1.suspend", True, changed("spec.agents.0.suspend", True, old))
    assert python_refuses(every)


def test_resources_scheduling_and_suspend_may_change_while_running() -> None:
    old = started(QUICKSTART)
    new = changed("spec.agents.0.resources", {"learner": {"limits": {"memory": "32Gi"}}}, old)
    new = changed("spec.suspend", True, new)
    new = changed("spec.scheduling", {"nodeSelector": {"pool": "gpu"}}, new)
    assert violations(new, old=old) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("spec.agents.0.name", "Llama_Char"),
        ("spec.agents.0.name", "a" * 41),
        ("spec.agents.0.model", "m" * 1025),
        ("spec.data.eval", [{"name": f"e{i}", "source": "builtin://arithmetic"} for i in range(33)]),
    ],
)
def test_names_and_sizes_are_limited_in_the_schema_as_in_the_spec(field: str, value: Any) -> None:
    document = changed(field, value)
    jsonschema.validate(QUICKSTART, openapi_to_jsonschema(SCHEMA))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, openapi_to_jsonschema(SCHEMA))
    assert python_refuses(document)


def test_agents_are_a_list_map_keyed_by_name_and_conditions_by_type() -> None:
    agents = SCHEMA["properties"]["spec"]["properties"]["agents"]
    assert (agents["x-kubernetes-list-type"], agents["x-kubernetes-list-map-keys"], agents["maxItems"]) == (
        "map",
        ["name"],
        32,
    )
    conditions = SCHEMA["properties"]["status"]["properties"]["conditions"]
    assert (conditions["x-kubernetes-list-type"], conditions["x-kubernetes-list-map-keys"]) == ("map", ["type"])
    item = conditions["items"]
    assert set(item["required"]) == {"type", "status", "reason", "lastTransitionTime"}
    assert (
        item["properties"]["lastTransitionTime"]["format"] == "date-time"
        and item["properties"]["message"]["maxLength"] == 32768
    )


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it: a missing field with a default gets it,
    inside every object that is present."""
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(value[name], sub)
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def test_schema_defaults_are_the_spec_defaults() -> None:
    spec_schema = SCHEMA["properties"]["spec"]
    algorithm = spec_schema["properties"]["algorithm"]["properties"]
    assert (algorithm["groupSize"]["default"], algorithm["delta"]["default"], algorithm["ratioBounds"]["default"]) == (
        8,
        0.2,
        [0.1, 10.0],
    )
    minimal = copy.deepcopy(QUICKSTART)
    defaulted = copy.deepcopy(minimal)
    defaulted["spec"] = apply_defaults(defaulted["spec"], spec_schema)
    assert defaulted != minimal, "the quickstart leaves fields to their defaults"
    assert dump_experiment(parse_experiment(defaulted)) == dump_experiment(parse_experiment(minimal))


def without_mini_batch(prompts: int) -> dict[str, Any]:
    document = changed("spec.algorithm.promptsPerStep", prompts)
    del document["spec"]["algorithm"]["miniBatchPrompts"]
    return document


@pytest.mark.parametrize("prompts", [1, 8, 32, 64, 128, 192])
def test_without_mini_batch_prompts_an_update_takes_min_64_prompts_in_both(prompts: int) -> None:
    """The API server fills in schema defaults before it runs the CEL rules: a fixed default of 64
    would refuse every promptsPerStep below 64 that leaves miniBatchPrompts out."""
    document = without_mini_batch(prompts)
    defaulted = copy.deepcopy(document)
    defaulted["spec"] = apply_defaults(defaulted["spec"], SCHEMA["properties"]["spec"])
    assert violations(defaulted) == []
    assert parse_experiment(defaulted).spec.algorithm.mini_batch_prompts == min(64, prompts)


def test_without_mini_batch_prompts_a_step_64_does_not_divide_is_refused_by_both() -> None:
    document = without_mini_batch(100)
    found = violations(document)
    assert any("without miniBatchPrompts" in m for m in found), found
    with pytest.raises(
        SpecError, match=r"spec.algorithm.*miniBatchPrompts \(64, the default\) must divide promptsPerStep \(100\)"
    ):
        parse_experiment(document)


def nullable_enums(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    if schema.get("nullable") and "enum" in schema and None not in schema["enum"]:
        yield path
    for name, sub in (schema.get("properties") or {}).items():
        yield from nullable_enums(sub, f"{path}.{name}")
    if "items" in schema:
        yield from nullable_enums(schema["items"], f"{path}[]")


def test_no_nullable_field_has_an_enum_that_refuses_null() -> None:
    """OpenAPI's enum applies to null as well (nullable only widens the type), so `zeroStage: null`
    would be refused although the schema says nullable; such fields are not nullable: the API
    server prunes a null of a non-nullable field, which then reads as absent (the spec's None)."""
    assert list(nullable_enums(SCHEMA)) == []
    document = changed("spec.agents.0.learner", {"backend": "deepspeed"})
    assert parse_experiment(document).spec.agents[0].learner.zero_stage is None
