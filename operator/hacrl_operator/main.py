"""kopf entry point: `kopf run -m hacrl_operator.main --all-namespaces` (or `-n NS`).

Start-up and handler registration only; `python -m hacrl_operator` is the same operator with
its namespaces and liveness endpoint taken from the environment (see config.py).
"""

from __future__ import annotations

import kopf

from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers import register

config = OperatorConfig.from_env()
reconciler = register(kopf.get_default_registry(), config)
