"""A new algorithm is one module: dropped into hacrl_core/algorithms/ or named by an installed
package's ``hacrl.algorithms`` entry point, it is found by the spec (`hacrl validate`, the
operator: without importing it or torch) and by the learner (which imports it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hacrl_core.algorithm_plugins import dropped_in, read_entry
from hacrl_core.catalog import AlgorithmDescriptor

ROOT = Path(__file__).resolve().parents[2]

#: docs/algorithm.md's worked example: GSPO's clipped sequence ratio on every row, a peer's too
#: (scored by its source), under a name of its own.
PLUGIN = textwrap.dedent('''
    """gspo-shared: GSPO's clipped sequence-ratio loss on the own and the peers' rows."""

    from hacrl_core.algorithms import PolicyLossInputs, gspo_loss, masked_mean, register_policy_loss
    from hacrl_core.catalog import AlgorithmDescriptor

    CATALOG_ENTRY = AlgorithmDescriptor(name="gspo-shared", shares_rows=True, advantage_mode="naive",
                                        cross_old_logprob="source", policy_loss="gspo-shared")


    @register_policy_loss("gspo-shared")
    def gspo_shared_loss(inputs: PolicyLossInputs, settings):
        row_mean = masked_mean(inputs.logp_new, inputs.response_mask, dim=-1)
        return gspo_loss(row_mean, inputs.logp_old_mean, inputs.advantages, clip=(settings.own_clip_low, settings.own_clip_high))
''')

SPEC = textwrap.dedent("""
    apiVersion: hacrl.io/v1alpha1
    kind: HACRLExperiment
    metadata: {name: plugin}
    spec:
      agents:
        - {name: a, model: "tiny://llama-char"}
        - {name: b, model: "tiny://qwen2-bpe"}
      algorithm: {name: gspo-shared, groupSize: 2, promptsPerStep: 2, miniBatchPrompts: 1}
      data: {train: {source: "builtin://arithmetic"}}
""")


@pytest.fixture
def installed_plugin(tmp_path: Path) -> Path:
    """A folder holding the plugin module and a distribution's metadata naming it in the
    ``hacrl.algorithms`` group: on sys.path, as an installed package is."""
    (tmp_path / "gspo_shared_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "gspo_shared_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gspo-shared-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[hacrl.algorithms]\ngspo-shared = gspo_shared_plugin\n")
    (tmp_path / "spec.yaml").write_text(SPEC)
    return tmp_path


def run(args: list[str], path: Path | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path)] * (path is not None) + [str(ROOT)])}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_hacrl_validate_accepts_an_installed_plugins_name(installed_plugin: Path):
    spec = str(installed_plugin / "spec.yaml")
    accepted = run(["-m", "hacrl_core.cli", "validate", spec], installed_plugin)
    assert accepted.returncode == 0, accepted.stderr
    assert "algorithm gspo-shared" in accepted.stdout
    refused = run(["-m", "hacrl_core.cli", "validate", spec], None)  # not installed: an unknown name
    assert (
        refused.returncode == 1
        and "spec.algorithm.name: Input should be 'hacpo', 'gspo', 'grpo' or 'naive'" in refused.stderr
    )


def test_the_spec_reads_a_plugin_without_torch_and_the_learner_imports_it(installed_plugin: Path):
    program = textwrap.dedent(f"""
        import json, sys
        from hacrl_core.spec import load_experiment
        from hacrl_core.crd import build_crd
        experiment = load_experiment({str(installed_plugin / "spec.yaml")!r})
        schema = json.dumps(build_crd())
        torch_free = "torch" not in sys.modules
        from hacrl_core.algorithms import resolve_algorithm
        algorithm = resolve_algorithm(experiment.spec.algorithm)
        print(json.dumps({{"torch_free": torch_free, "in_crd": "gspo-shared" in schema, "loss": algorithm.policy_loss.__name__,
                          "shares_rows": algorithm.shares_rows, "entry": algorithm.entry.name}}))
    """)
    result = run(["-c", program], installed_plugin)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "torch_free": True,
        "in_crd": True,
        "loss": "gspo_shared_loss",
        "shares_rows": True,
        "entry": "gspo-shared",
    }


def test_a_shared_row_plugin_needs_two_agents(installed_plugin: Path):
    one_agent = SPEC.replace('    - {name: b, model: "tiny://qwen2-bpe"}\n', "")
    assert one_agent != SPEC
    (installed_plugin / "spec.yaml").write_text(one_agent)
    result = run(["-m", "hacrl_core.cli", "validate", str(installed_plugin / "spec.yaml")], installed_plugin)
    assert result.returncode == 1 and "gspo-shared" in result.stderr


def test_a_module_dropped_into_the_algorithms_folder_is_found_by_its_entry(tmp_path: Path):
    (tmp_path / "gspo_shared.py").write_text(PLUGIN)
    (tmp_path / "helpers.py").write_text("X = 1\n")  # no entry: not an algorithm
    [found] = dropped_in(tmp_path, "pkg")
    assert found.module == "pkg.gspo_shared"
    assert found.entry == AlgorithmDescriptor(
        name="gspo-shared",
        shares_rows=True,
        advantage_mode="naive",
        cross_old_logprob="source",
        policy_loss="gspo-shared",
    )


def test_an_entry_that_is_not_literal_is_refused_with_its_file(tmp_path: Path):
    path = tmp_path / "computed.py"
    path.write_text(
        'NAME = "x"\nCATALOG_ENTRY = AlgorithmDescriptor(name=NAME, shares_rows=False, advantage_mode="gspo", '
        'cross_old_logprob="source", policy_loss="gspo")\n'
    )
    with pytest.raises(ValueError, match="computed.py: CATALOG_ENTRY must be AlgorithmDescriptor"):
        read_entry(path)
