"""What a worker's exit code tells its supervisor (`hacrl run`'s, or the operator reading a pod's
container status): restart it, report it, or restart it as a preemption. A module of constants
only: the operator reads it without the workers' code (its image has no torch)."""

#: A known error a restart may get past (a reward server still down once its retries ran out):
#: restarted within ``restartLimit``, then reported by its line (``runtime.worker_failures``).
RESTARTABLE_EXIT_CODE = 5
#: A known error a restart would only meet again: reported by its line, never restarted.
FINAL_EXIT_CODE = 6
#: The worker stopped on SIGTERM (pod deleted, evicted, preempted, node drained; `hacrl run`
#: stopped): it finished or abandoned its step in flight and checkpointed its last finished one
#: (``hacrl_core.preemption``). A preemption, not a failure: restarted, never counted against
#: ``restartLimit`` (`hacrl run`'s supervisor, the operator's ``status.pods``).
PREEMPTED_EXIT_CODE = 7
