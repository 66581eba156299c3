"""HACRL's alert rules (charts/hacrl-operator/files/alerts/hacrl.rules.yaml) under `promtool test
rules`, Prometheus' own rule unit tester (Debian's `prometheus` package), and as the chart ships them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.chart.rendering import CHART, objects, one, render

RULES = CHART / "files" / "alerts" / "hacrl.rules.yaml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
LEARNER = 'experiment="e",agent="a",role="learner"'

# Each case: input series (promtool's expanding notation, one sample a minute), the time to
# evaluate at, and the alerts expected firing then (labels, value): an empty list for none.
CASES = {
    "failed experiment fires after 1m": (
        [
            ('hacrl_operator_experiments{phase="Failed"}', "0 0 1 1 1"),
            ('hacrl_operator_experiments{phase="Running"}', "1 1 0 0 0"),
        ],
        [("HACRLExperimentFailed", "4m", [({"severity": "critical"}, "1")]), ("HACRLExperimentFailed", "2m", [])],
    ),
    "a stuck learner fires, a progressing one does not": (
        [
            (f"hacrl_steps_total{{{LEARNER}}}", "0+1x20 20x60"),
            (f'hacrl_worker_info{{{LEARNER},version="0.1.0"}}', "1x80"),
            ('hacrl_steps_total{experiment="e",agent="b",role="learner"}', "0+1x80"),
            ('hacrl_worker_info{experiment="e",agent="b",role="learner",version="0.1.0"}', "1x80"),
        ],
        [
            ("HACRLNoProgress", "25m", []),
            ("HACRLNoProgress", "60m", [({"severity": "warning", "experiment": "e", "agent": "a"}, "0")]),
        ],
    ),
    "a learner still starting is not stuck": (
        [(f"hacrl_steps_total{{{LEARNER}}}", "0x40"), (f'hacrl_worker_info{{{LEARNER},version="0.1.0"}}', "1x40")],
        [("HACRLNoProgress", "20m", [])],
    ),
    "restarts climbing": (
        [("hacrl_operator_pod_restarts_total", "0 1 2 3 4 5 6")],
        [("HACRLPodRestartsClimbing", "6m", [({"severity": "warning"}, "6")]), ("HACRLPodRestartsClimbing", "2m", [])],
    ),
    "every shared row clipped fires, some used does not": (
        [
            (f"hacrl_learner_cross_rows_total{{{LEARNER}}}", "0+16x60"),
            (f"hacrl_learner_shared_rows_used_total{{{LEARNER}}}", "0x60"),
            ('hacrl_learner_cross_rows_total{experiment="e",agent="b",role="learner"}', "0+16x60"),
            ('hacrl_learner_shared_rows_used_total{experiment="e",agent="b",role="learner"}', "0+2x60"),
        ],
        [
            ("HACRLSharedRowsAllClipped", "5m", []),
            ("HACRLSharedRowsAllClipped", "50m", [({"severity": "warning", "experiment": "e", "agent": "a"}, "480")]),
        ],
    ),
}


def annotations(alert: str, labels: dict[str, str], value: str) -> dict[str, str]:
    """The rule's annotations as Prometheus renders them for these labels and value."""
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r["alert"] == alert)
    rendered = {}
    for key, text in rule["annotations"].items():
        text = text.replace("{{ $value | humanize }}", value).replace("{{ $value }}", value)
        rendered[key] = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    return rendered


def promtool_tests() -> dict:
    tests = []
    for name, (series, checks) in CASES.items():
        tests.append(
            {
                "name": name,
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [
                    {
                        "eval_time": at,
                        "alertname": alert,
                        "exp_alerts": [
                            {"exp_labels": labels, "exp_annotations": annotations(alert, labels, value)}
                            for labels, value in expected
                        ],
                    }
                    for alert, at, expected in checks
                ],
            }
        )
    return {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert Path(PROMTOOL).exists(), (
        f"no promtool at {PROMTOOL}: install Debian's `prometheus` package (make test does where apt is available)"
    )
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def test_rules_are_valid() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_fires_when_it_should_and_only_then(tmp_path: Path) -> None:
    tests = tmp_path / "hacrl-rules-test.yaml"
    tests.write_text(yaml.safe_dump(promtool_tests(), sort_keys=False))
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    assert alerts == {alert for _, checks in CASES.values() for alert, _, _ in checks}, "every alert has a case"


def test_a_wrong_expectation_fails_the_promtool_run(tmp_path: Path) -> None:
    """The harness can fail: a stuck learner expected silent is reported."""
    document = promtool_tests()
    document["tests"] = [t for t in document["tests"] if t["name"].startswith("a stuck learner")]
    document["tests"][0]["alert_rule_test"][1]["exp_alerts"] = []
    tests = tmp_path / "wrong.yaml"
    tests.write_text(yaml.safe_dump(document, sort_keys=False))
    result = promtool("test", "rules", str(tests))
    assert result.returncode != 0 and "HACRLNoProgress" in result.stdout + result.stderr


def test_the_chart_ships_the_tested_rules_only_when_asked() -> None:
    assert not objects(render(), "PrometheusRule"), "alerts are off by default"
    rule = one(
        render(sets=("prometheusRule.enabled=true", "prometheusRule.labels.release=prometheus")), "PrometheusRule"
    )
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
