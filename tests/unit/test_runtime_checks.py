"""Settings the spec admits but this installation cannot run are refused, never ignored."""

import copy

import pytest
import yaml

from hacrl_core.runtime.context import unsupported_settings
from hacrl_core.runtime.local import prepare
from hacrl_core.spec import SpecError, parse_experiment
from tests.unit.test_spec import MINIMAL


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
