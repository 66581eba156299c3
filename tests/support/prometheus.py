"""Start a real Prometheus server (Debian's `prometheus` package) on 127.0.0.1 for tests.

    with prometheus_server(tmp_dir, targets=["127.0.0.1:9400"]) as prom:
        prom.wait_scraped(lambda: ...)
        prom.query_range('rate(hacrl_steps_total[30s])', start, end)

It scrapes every target each second, keeps its TSDB in the test's folder, and answers PromQL
over its HTTP API. PROMETHEUS (env HACRL_PROMETHEUS_BIN) names the binary; `make test` installs
the package where apt is available (Makefile, `system-packages`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PROMETHEUS = os.environ.get("HACRL_PROMETHEUS_BIN") or shutil.which("prometheus") or "/usr/bin/prometheus"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class PrometheusServer:
    url: str
    log: Path

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=str(step))["result"]

    def targets_up(self) -> dict[str, str]:
        """Each active target's scrape URL and health (up, down, unknown)."""
        return {t["scrapeUrl"]: t["health"] for t in self.api("targets")["activeTargets"]}


@contextmanager
def prometheus_server(
    workdir: Path, targets: Sequence[str], *, job: str = "hacrl", interval: str = "1s"
) -> Iterator[PrometheusServer]:
    if not Path(PROMETHEUS).exists() and not shutil.which(PROMETHEUS):
        raise RuntimeError(
            f"no Prometheus server binary at {PROMETHEUS}: install Debian's `prometheus` package "
            "(make test does where apt is available) or set HACRL_PROMETHEUS_BIN"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": interval, "evaluation_interval": interval},
                "scrape_configs": [
                    {
                        "job_name": job,
                        "scrape_interval": interval,
                        "scrape_timeout": interval,
                        "static_configs": [{"targets": list(targets)}],
                    }
                ],
            }
        )
    )
    port = _free_port()
    log = workdir / "prometheus.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = PrometheusServer(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"Prometheus exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus not ready after 60 s: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
