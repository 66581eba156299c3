"""The Grafana dashboard queries metrics that exist: the operator's (hacrl_operator_*, from its
registry) and the workers' (hacrl_rollout_*, hacrl_learner_*, hacrl_capability_*, hacrl_eval_*:
a JSON key `learner/pg_loss` becomes the gauge `hacrl_learner_pg_loss`, hacrl_core/metrics.py)."""

from __future__ import annotations

import json
import re

import pytest

from hacrl_core.metrics import COUNTED_KEYS, WorkerMetrics, prometheus_name
from hacrl_operator.metrics import OperatorMetrics
from tests.chart.rendering import CHART, ROOT

DASHBOARD = json.loads((CHART / "files" / "dashboards" / "hacrl.json").read_text())
WORKER_FAMILIES = (
    "hacrl_rollout_",
    "hacrl_learner_",
    "hacrl_capability_",
    "hacrl_eval_",
    "hacrl_worker_",
    "hacrl_steps_",
    "hacrl_weights_",
    "hacrl_store_",
)


def expressions() -> list[str]:
    exprs = [t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in DASHBOARD["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def operator_labels() -> dict[str, set[str]]:
    """Every operator series with its label names (the histogram's buckets add `le`)."""
    metrics = OperatorMetrics()
    with metrics.track("create"):
        pass
    metrics.errors.labels("create", "ValueError").inc(0)
    metrics.restarts.inc(0)
    return {sample.name: set(sample.labels) for family in metrics.registry.collect() for sample in family.samples}


def operator_series() -> set[str]:
    return set(operator_labels())


def served_by_workers() -> set[str]:
    """Series a worker's registry serves for a step: its info, counters, histograms and gauges."""
    served = set()
    for role in ("rollout", "learner"):
        metrics = WorkerMetrics("exp", "agent", role)
        metrics.count_from("hacrl_store_retries", "retries", lambda: 0)
        metrics.publish_step(
            {
                "learner/cross_rows": 4,
                "learner/cross_clip_frac": 0.5,
                "learner/seconds_update": 0.1,
                "weights_version": 1,
            }
        )
        served |= {sample.name for family in metrics.registry.collect() for sample in family.samples}
    return served


def worker_series() -> set[str]:
    """Series the workers can serve: the step keys written in hacrl_core through prometheus_name
    (gauges; the counted keys are counters instead), and what a worker's registry serves."""
    keys = set()
    sources = [p.read_text() for p in (ROOT / "hacrl_core").rglob("*.py")]
    for text in sources:
        keys |= set(re.findall(r'"((?:rollout|learner|capability|eval)/[a-z0-9_]+)"', text))
    # learner/{key} for every key of a policy loss's metrics dict and the learner's own additions
    for path in [*(ROOT / "hacrl_core" / "algorithms").glob("*.py"), *(ROOT / "hacrl_core" / "learner").glob("*.py")]:
        keys |= {f"learner/{k}" for k in re.findall(r'"([a-z][a-z0-9_]*)"\s*:', path.read_text())}
        keys |= {
            f"learner/{k}"
            for k in re.findall(r'(?:metrics|collected)(?:\[|\.setdefault\()"([a-z_]+)"', path.read_text())
        }
    # per-agent and per-eval-set keys, with sample names
    keys |= {"capability/qwen-bpe", "capability/ratio/llama-char", "eval/arithmetic/accuracy", "weights_version"}
    return {prometheus_name(k) for k in keys - COUNTED_KEYS} | served_by_workers()


def test_dashboard_shape():
    assert DASHBOARD["uid"] == "hacrl-overview"
    names = [v["name"] for v in DASHBOARD["templating"]["list"]]
    assert names == ["datasource", "experiment", "agent"]
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in DASHBOARD["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]


def test_every_family_is_on_the_dashboard():
    text = " ".join(expressions())
    for family in (*WORKER_FAMILIES, "hacrl_operator_"):
        assert family in text, family


@pytest.mark.parametrize("expr", expressions())
def test_queried_metrics_exist(expr):
    operator, worker = operator_series(), worker_series()
    exact = set(re.findall(r"\b(hacrl_[a-z0-9_]+)\b", re.sub(r'"[^"]*"', '""', expr)))
    for name in exact:
        if name.startswith("hacrl_operator_"):
            assert name in operator, f"{name} is not an operator metric: {sorted(operator)}"
        else:
            assert name.startswith(WORKER_FAMILIES), name
            assert name in worker, f"{name}: no worker serves this series"
    for pattern in re.findall(r'__name__=~"([^"]+)"', expr):
        matched = {name for name in worker | operator if re.fullmatch(pattern, name)}
        assert matched, f"{pattern} matches no worker metric"
        assert all(name.startswith(WORKER_FAMILIES) for name in matched), f"{pattern} also matches {sorted(matched)}"


def test_the_check_is_not_vacuous():
    assert "hacrl_learner_pg_loss" in worker_series() and "hacrl_learner_pg_los" not in worker_series()
    assert "hacrl_operator_reconciles_total" in operator_series()
    names = set(re.findall(r"\b(hacrl_[a-z0-9_]+)\b", re.sub(r'"[^"]*"', '""', " ".join(expressions()))))
    assert len(names) > 20, names


def test_counted_keys_are_counters_not_gauges():
    served = served_by_workers()
    assert {
        "hacrl_learner_cross_rows_total",
        "hacrl_learner_shared_rows_used_total",
        "hacrl_steps_total",
        "hacrl_store_retries_total",
        "hacrl_worker_info",
        "hacrl_learner_step_seconds_bucket",
    } <= served
    assert "hacrl_learner_cross_rows" not in worker_series()


def test_worker_metric_naming_rule():
    assert prometheus_name("learner/pg_loss") == "hacrl_learner_pg_loss"
    assert prometheus_name("eval/arithmetic/pass@4") == "hacrl_eval_arithmetic_pass_4"


def test_operator_panels_group_by_labels_that_exist():
    labels = operator_labels()
    checked = 0
    for expr in expressions():
        names = [n for n in re.findall(r"\b(hacrl_operator_[a-z0-9_]+)\b", expr) if n in labels]
        for group in re.findall(r"\bby \(([^)]*)\)", expr):
            for name in names:
                assert {g.strip() for g in group.split(",")} <= labels[name], (
                    f"{expr}: {name} has labels {sorted(labels[name])}"
                )
                checked += 1
    assert checked >= 3
