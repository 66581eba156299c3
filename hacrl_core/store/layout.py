"""The key layout of one experiment in the trajectory store (DESIGN.md section 3).

```
<experiment>/spec.yaml
<experiment>/steps/<t:06d>/rollouts/<agent>.parquet
<experiment>/steps/<t:06d>/scores/<agent>.parquet
<experiment>/steps/<t:06d>/metrics/<agent>.json
<experiment>/weights/<agent>/<version:06d>/          (committed directory)
<experiment>/checkpoints/<agent>/<t:06d>/            (committed directory)
<experiment>/progress/<agent>.json
<experiment>/owner.json                              (who owns the prefix: ownership.py)
<experiment>/leases/<agent>.<role>.json              (fencing.py; leases/run.json for `hacrl run`)
```
Pure functions: every key of the store is built here and nowhere else. Directory prefixes are
returned without the trailing ``/``.
"""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """An experiment or agent name: 1-128 of ``[A-Za-z0-9._-]``, starting alphanumeric."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(
            f"{kind} name {name!r} must be 1-128 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_index(kind: str, value: int) -> int:
    """A step or version number: a non-negative int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{kind} must be a non-negative int, got {value!r}")
    return value


def parse_index(segment: str) -> int | None:
    """The number a ``<n:06d>`` segment encodes, or None if it is not one."""
    return int(segment) if segment.isdigit() and len(segment) >= 6 else None


def experiment_prefix(experiment: str) -> str:
    return check_name("experiment", experiment)


def spec_key(experiment: str) -> str:
    return f"{experiment_prefix(experiment)}/spec.yaml"


def steps_prefix(experiment: str) -> str:
    return f"{experiment_prefix(experiment)}/steps"


def step_prefix(experiment: str, step: int) -> str:
    return f"{steps_prefix(experiment)}/{check_index('step', step):06d}"


def rollouts_key(experiment: str, step: int, agent: str) -> str:
    return f"{step_prefix(experiment, step)}/rollouts/{check_name('agent', agent)}.parquet"


def scores_key(experiment: str, step: int, agent: str) -> str:
    return f"{step_prefix(experiment, step)}/scores/{check_name('agent', agent)}.parquet"


def metrics_key(experiment: str, step: int, agent: str) -> str:
    return f"{step_prefix(experiment, step)}/metrics/{check_name('agent', agent)}.json"


def weights_root(experiment: str, agent: str) -> str:
    return f"{experiment_prefix(experiment)}/weights/{check_name('agent', agent)}"


def weights_prefix(experiment: str, agent: str, version: int) -> str:
    return f"{weights_root(experiment, agent)}/{check_index('version', version):06d}"


def checkpoints_root(experiment: str, agent: str) -> str:
    return f"{experiment_prefix(experiment)}/checkpoints/{check_name('agent', agent)}"


def checkpoint_prefix(experiment: str, agent: str, step: int) -> str:
    return f"{checkpoints_root(experiment, agent)}/{check_index('step', step):06d}"


def progress_key(experiment: str, agent: str) -> str:
    return f"{experiment_prefix(experiment)}/progress/{check_name('agent', agent)}.json"


def owner_key(experiment: str) -> str:
    return f"{experiment_prefix(experiment)}/owner.json"


def leases_prefix(experiment: str) -> str:
    return f"{experiment_prefix(experiment)}/leases"


def lease_key(experiment: str, agent: str, role: str) -> str:
    return f"{leases_prefix(experiment)}/{check_name('agent', agent)}.{role}.json"


def run_lease_key(experiment: str) -> str:
    return f"{leases_prefix(experiment)}/run.json"
