"""`python -m hacrl_operator`: run the operator with every setting from the environment.

With ``HACRL_LEADER_ELECTION_LEASE`` set (the chart sets it), the process first waits as a
standby until it holds the Lease (leader.py), and only then starts kopf; if it later loses the
Lease it exits at once, and Kubernetes restarts it as a standby.
"""

from __future__ import annotations

import logging
import os
import sys

from hacrl_operator.config import ConfigError, OperatorConfig

# Exit status of a leader that lost its Lease (any status restarts the container; this one says why).
LOST_LEASE_EXIT = 3

logger = logging.getLogger("hacrl_operator")


def lost_lease(reason: str) -> None:
    """Stop acting now: a standby may take the Lease once ``lease_duration`` has passed since our last
    renewal, and ``renew_deadline`` is shorter, so exiting here ends our work before that. A
    graceful kopf shutdown could keep handlers running past it; client-go's controllers exit too."""
    logger.critical("leader: %s; exiting so that this replica restarts as a standby", reason)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(LOST_LEASE_EXIT)


def main() -> int:
    try:
        config = OperatorConfig.from_env()
    except ConfigError as error:
        print(f"hacrl-operator: configuration error: {error}", file=sys.stderr)
        return 2
    import kopf

    from hacrl_operator.handlers import register

    kopf.configure(verbose="-v" in sys.argv[1:], log_format=kopf.LogFormat.FULL)
    elector = None
    if config.leader_lease is not None:
        from hacrl_operator.kube import load_configuration
        from hacrl_operator.leader import LeaderElector, LeaseClient, Timing
        from hacrl_operator.standby import serve_standby

        namespace, name = config.leader_lease
        client = LeaseClient(load_configuration(config), namespace, name, timeout=config.renew_deadline / 2)
        elector = LeaderElector(
            client, config.leader_identity, Timing(config.lease_duration, config.renew_deadline, config.retry_period)
        )
        with serve_standby(config.health_port, config.metrics_port, lambda: elector.holder):
            elector.acquire()
        elector.keep_renewing(lost_lease)
    registry = kopf.OperatorRegistry()
    register(registry, config)
    try:
        kopf.run(
            registry=registry,
            clusterwide=config.clusterwide,
            namespaces=list(config.namespaces),
            # The Lease, not kopf's peering, decides who acts: peering would only pause replicas
            # of lower priority, and needs its own cluster-wide objects.
            standalone=True,
            liveness_endpoint=f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None,
        )
    finally:
        if elector is not None:
            elector.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
