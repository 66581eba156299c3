"""The key layout of one experiment in the trajectory store (docs/architecture.md, "The trajectory store").

```
<experiment>/spec.yaml
<experiment>/steps/<t:06d>/rollouts/<agent>.parquet
<experiment>/steps/<t:06d>/rollouts/<agent>/part-<r:02d>-of-<R:02d>.parquet   (rollout.replicas R > 1)
<experiment>/steps/<t:06d>/scores/<agent>.parquet
<experiment>/steps/<t:06d>/metrics/<agent>.json
<experiment>/steps/<t:06d>/members.json              (the step's team: membership.py)
<experiment>/weights/<agent>/<version:06d>/          (committed directory)
<experiment>/checkpoints/<agent>/<t:06d>/            (committed directory)
<experiment>/progress/<agent>.json
<experiment>/owner.json                              (who owns the prefix: ownership.py)
<experiment>/leases/<agent>.<role>.json              (fencing.py; leases/run.json for `hacrl run`)
<experiment>/leases/<agent>.rollout-<r>.json          (rollout replica r of R > 1)
```
Pure functions: every key of the store is built here and nowhere else. Directory prefixes are
returned without the trailing ``/``.

Rollout parts: an agent whose rollout has R > 1 replicas (``rollout.replicas``) writes each
step's rollouts as R parts, replica r the rows of its slice of the step's prompts, each a
committed object of its own. A step's rollouts are the R parts in replica order, and exist only
once all R are committed. The parts live in a folder named after the agent (agent names may hold
``.``, so ``<agent>.part-...`` could be another agent's shard), and each key names R, so that
parts written under another replica count are never mistaken for a part of this one. R = 1 is
exactly the single shard ``<agent>.parquet`` (stores written before replicas read unchanged).
Each replica holds its own lease (``rollout-<r>``), so that replicas never fence each other
while a restarted replica still fences its own older incarnation.
"""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """An experiment or agent name: 1-128 of ``[A-Za-z0-9._-]``, starting alphanumeric."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
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


def check_replica(replica: int, replicas: int) -> int:
    """Replica ``replica`` (0-based) of ``replicas``: 0 <= replica < replicas <= 64."""
    check_index("replicas", replicas)
    if not 1 <= replicas <= 64:
        raise ValueError(f"replicas must be 1..64, got {replicas}")
    if isinstance(replica, bool) or not isinstance(replica, int) or not 0 <= replica < replicas:
        raise ValueError(f"replica must be an int in 0..{replicas - 1} (of {replicas} replicas), got {replica!r}")
    return replica


def rollouts_part_key(experiment: str, step: int, agent: str, replica: int, replicas: int) -> str:
    """Replica ``replica``'s part of the step's rollouts; with one replica, the whole shard."""
    check_replica(replica, replicas)
    if replicas == 1:
        return rollouts_key(experiment, step, agent)
    return f"{step_prefix(experiment, step)}/rollouts/{check_name('agent', agent)}/part-{replica:02d}-of-{replicas:02d}.parquet"


def rollouts_part_keys(experiment: str, step: int, agent: str, replicas: int) -> list[str]:
    """Every part of the step's rollouts, in replica order (the order readers concatenate them)."""
    check_replica(0, replicas)
    return [rollouts_part_key(experiment, step, agent, r, replicas) for r in range(replicas)]


def scores_key(experiment: str, step: int, agent: str) -> str:
    return f"{step_prefix(experiment, step)}/scores/{check_name('agent', agent)}.parquet"


def members_key(experiment: str, step: int) -> str:
    """The agents that are the team of ``step`` (``membership.py``)."""
    return f"{step_prefix(experiment, step)}/members.json"


MEMBERS_FILE = "members.json"


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


def tracking_key(experiment: str, agent: str) -> str:
    """The agent's run ids in the experiment trackers (a resume continues those runs)."""
    return f"{experiment_prefix(experiment)}/tracking/{check_name('agent', agent)}.json"


def owner_key(experiment: str) -> str:
    return f"{experiment_prefix(experiment)}/owner.json"


def leases_prefix(experiment: str) -> str:
    return f"{experiment_prefix(experiment)}/leases"


def lease_key(experiment: str, agent: str, role: str, replica: int | None = None) -> str:
    """The lease of ``agent``'s ``role`` worker; ``replica``: of one rollout replica of several."""
    suffix = "" if replica is None else f"-{check_index('replica', replica)}"
    return f"{leases_prefix(experiment)}/{check_name('agent', agent)}.{role}{suffix}.json"


def run_lease_key(experiment: str) -> str:
    return f"{leases_prefix(experiment)}/run.json"
