"""Runtime: the worker entry points (`hacrl worker rollout|learner`), the local executor
(`hacrl run`), evaluation and reports. Pods on a cluster run the very same workers."""
