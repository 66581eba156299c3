"""`python -m hacrl_operator`: run the operator with every setting from the environment."""

from __future__ import annotations

import sys

from hacrl_operator.config import ConfigError, OperatorConfig


def main() -> int:
    try:
        config = OperatorConfig.from_env()
    except ConfigError as error:
        print(f"hacrl-operator: configuration error: {error}", file=sys.stderr)
        return 2
    import kopf

    from hacrl_operator.handlers import register

    kopf.configure(verbose="-v" in sys.argv[1:], log_format=kopf.LogFormat.FULL)
    registry = kopf.OperatorRegistry()
    register(registry, config)
    kopf.run(
        registry=registry,
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        standalone=True,
        liveness_endpoint=f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
