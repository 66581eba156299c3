"""Settings the spec admits but this installation cannot run are refused, never ignored."""

import copy

import pytest
import yaml

from hacrl_core.context import unsupported_settings
from hacrl_core.runtime.local import prepare
from hacrl_core.spec import SpecError, parse_experiment
from tests.support.documents import MINIMAL


def test_deepspeed_backend_and_missing_vllm_are_refused_with_field_paths():
    document = copy.deepcopy(MINIMAL)
    document["spec"]["agents"][0]["learner"] = {"backend": "deepspeed"}
    document["spec"]["agents"][1]["rollout"] = {"engine": "vllm"}
    problems = unsupported_settings(parse_experiment(document))
    from hacrl_core.learner.backends import available_backends

    refused_backend = any(p.startswith("spec.agents[0].learner.backend:") for p in problems)
    assert refused_backend == ("deepspeed" not in available_backends())
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert any(p.startswith("spec.agents[1].rollout.engine:") and "use engine: hf" in p for p in problems)


def test_default_spec_is_runnable():
    assert unsupported_settings(parse_experiment(MINIMAL)) == []


def test_hacrl_run_refuses_a_suspended_experiment(tmp_path):
    document = copy.deepcopy(MINIMAL)
    document["spec"]["suspend"] = True
    document["spec"]["store"] = {"uri": (tmp_path / "store").as_uri()}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(SpecError, match="spec.suspend"):
        prepare(path, resume=False, workdir=tmp_path / "work")


def test_checking_what_is_installed_imports_no_optional_engine_or_backend():
    """DeepSpeed and vLLM log to stdout when imported: `hacrl eval` prints JSON there, so merely
    validating a spec must not import them (it did, and broke `hacrl eval | jq`)."""
    import subprocess
    import sys

    probe = (
        "import sys; from hacrl_core.context import unsupported_settings; "
        "from hacrl_core.spec import parse_experiment; from tests.support.documents import MINIMAL; "
        "unsupported_settings(parse_experiment(MINIMAL)); "
        "print(sorted(m for m in ('deepspeed', 'vllm') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


def test_engine_for_configures_the_engine_from_the_agents_rollout_settings():
    from hacrl_core.rollout.engine import engine_for
    from hacrl_core.rollout.hf_engine import HFEngine
    from hacrl_core.spec import RolloutSettings

    engine = engine_for(RolloutSettings(batch_size=7))
    assert isinstance(engine, HFEngine) and engine.batch_size == 7
    assert engine.device == ("cuda" if __import__("torch").cuda.is_available() else "cpu")


def test_engine_for_an_engine_not_installed_names_the_alternatives(monkeypatch):
    from hacrl_core.registry import Registry
    from hacrl_core.rollout import engine as engines
    from hacrl_core.spec import RolloutSettings

    patched = Registry("rollout engine")
    patched.register("hf", engines.ENGINES.get("hf"))
    patched.register("vllm", engines.EngineModule("nowhere", "Nothing", requires="a-package-that-is-not-installed"))
    monkeypatch.setattr(engines, "ENGINES", patched)
    with pytest.raises(ValueError, match="'vllm' is not available here; available engines: hf"):
        engines.engine_for(RolloutSettings(engine="vllm"))


def test_torch_backend_gathered_weights_is_the_model_itself():
    import torch

    from hacrl_core.learner.backends import create_backend
    from hacrl_core.spec import LearnerSettings

    model = torch.nn.Linear(2, 2)
    backend = create_backend("torch", model, LearnerSettings())
    with backend.gathered_weights() as gathered:
        assert gathered is model
