"""The spec loads no ML library: the operator validates specs in an image without torch, and
`hacrl validate` stays instant. Its algorithm names come from the torch-free catalog."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import hacrl_core.spec
from hacrl_core.spec import dump_experiment, load_experiment
experiment = load_experiment(sys.argv[1])
dump_experiment(experiment)
print(json.dumps({"name": experiment.name, "loaded": sorted(m for m in ("torch", "numpy", "pyarrow", "transformers") if m in sys.modules)}))
"""


def test_importing_and_loading_a_spec_loads_no_ml_library() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT / "examples" / "quickstart.yaml")],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["name"] == "quickstart"  # the spec was really read
    assert report["loaded"] == [], f"importing hacrl_core.spec loaded {report['loaded']}"
