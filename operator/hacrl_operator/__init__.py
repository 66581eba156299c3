"""The HACRL Kubernetes operator: `HACRLExperiment` -> per-agent rollout and learner pods.

Run it with `python -m hacrl_operator` (settings from the environment, see ``config``) or
`kopf run -m hacrl_operator.main --all-namespaces`. Layout: ``builders`` (pure manifests),
``status`` (pure reconcile planning), ``handlers`` (thin kopf handlers + the reconcile executor),
``kube`` (dict client), ``metrics``, ``rbac`` (permissions used), ``config`` (environment).
"""
