"""The operator image carries no ML stack: importing the handlers and doing everything a reconcile
does besides talking to the API server (parse the body, read heartbeats and the owner record from
a real store, plan, build the pods) loads neither torch nor pyarrow nor numpy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import yaml
import hacrl_operator.handlers  # every handler the operator registers
from hacrl_operator import builders
from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers.reconcile import Reconciler
from hacrl_operator.metrics import OperatorMetrics
from hacrl_operator.status import Observed, plan_reconcile

store_uri = sys.argv[1]
body = yaml.safe_load(open(sys.argv[2]))
body["metadata"].update(namespace="ml", uid="uid-1")
body["spec"]["store"] = {"uri": store_uri}
reconciler = Reconciler(OperatorConfig(), OperatorMetrics())
experiment, errors = reconciler.parse(body)
assert experiment is not None, errors
progress, store_error = reconciler.read_progress(experiment)
refusal = reconciler.store_owner_refusal(experiment, body)
plan = plan_reconcile(Observed(experiment=experiment, progress=progress, store_error=store_error,
                               blocked=[("StoreOwnedByAnother", m) for m in refusal]))
pods = [builders.build_pod(experiment, agent, role, body, reconciler.config) for agent, role, _ in plan.create_pods]
print(json.dumps({"pods": len(pods), "store_error": store_error, "progress": progress,
                  "loaded": sorted(m for m in ("torch", "pyarrow", "numpy") if m in sys.modules)}))
"""


def test_a_reconcile_without_the_api_server_loads_no_ml_library(tmp_path: Path) -> None:
    store = tmp_path / "store"
    heartbeat = store / "ml" / "quickstart" / "progress" / "llama-char.json"
    heartbeat.parent.mkdir(parents=True)
    heartbeat.write_text(json.dumps({"step": 3}))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, store.as_uri(), str(ROOT / "examples" / "quickstart.yaml")],
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'operator'}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["store_error"] is None and report["progress"]["llama-char"] == {
        "step": 3
    }  # the store was really read
    assert report["pods"] == 4
    assert report["loaded"] == [], f"the operator loaded {report['loaded']}"
