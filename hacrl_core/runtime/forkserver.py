"""Start `hacrl run`'s workers from one process that has already imported torch and transformers.

Every worker is `hacrl worker <role>`; started as a fresh interpreter each one spends 2-4 s
importing torch, transformers and our modules, and on a few CPUs the workers of a run do it at the
same time (docs/benchmarks.md section 3: start-up 1.8-2.1x the in-process loop's). Python's
``forkserver`` start method does that import once, in a clean single-threaded server process
started when the run starts (so its imports overlap the dataset check and the model builds), and
forks each worker from it, restarts included.

A forked worker behaves as the fresh interpreter did, which is what the supervisor relies on:

- its own session and process group (``os.setsid``), so the supervisor's ``killpg`` reaches the
  worker and the processes it starts (learner ranks, the math-verify reward worker);
- stdout and stderr appended to its log file; its environment exactly the one the supervisor
  built (the server's own is replaced);
- the exit code is the CLI's return value, or minus the signal that killed it (as ``Popen``);
- ``atexit`` handlers run on the way out (a multiprocessing child would otherwise end with
  ``os._exit`` and skip them: the reward worker's cleanup is one).

As with any ``multiprocessing`` start method but fork, each worker imports the parent's main
module first (as ``__mp_main__``): for `hacrl run` that is the CLI, whose entry point is guarded.
``HACRL_FORK_SERVER=0`` starts every worker as a fresh interpreter instead, as pods always do.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.context import ForkServerContext
from pathlib import Path

#: "0" turns the fork server off: every worker is a fresh `python -m hacrl_core.cli` process.
FORK_SERVER_ENV = "HACRL_FORK_SERVER"
#: The command prefix of a hacrl CLI process; the fork server runs only these.
HACRL_CLI = (sys.executable, "-m", "hacrl_core.cli")
#: Imported once by the server before it forks any worker: what every worker imports first. Only
#: imports: nothing here may start threads, open connections or touch a GPU (each fork would share them).
WORKER_MODULES = (
    "torch",
    "transformers",
    # `import transformers` is lazy: the first from_pretrained imports modeling_utils (about 1.3 s
    # of the 1.5 s a worker spent loading a tiny model). The architectures of the tiny presets and
    # the documented real models cost about 0.05 s each; any other one is imported by its worker.
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen3.modeling_qwen3",
    "pyarrow",
    "pyarrow.parquet",
    "boto3",
    "hacrl_core.cli",
    "hacrl_core.context",
    "hacrl_core.learner.worker",
    "hacrl_core.rollout.worker",
    "hacrl_core.rollout.hf_engine",
    "hacrl_core.store.s3_store",
)


def cli_command(*arguments: str) -> list[str]:
    """The command line of a `hacrl` CLI process, e.g. ``cli_command("worker", "learner", ...)``."""
    return [*HACRL_CLI, *arguments]


class ForkedProcess:
    """A worker forked by the server, with the part of ``subprocess.Popen``'s interface the
    supervisor uses (``pid``, ``poll``, ``wait``, ``returncode``)."""

    def __init__(self, process: multiprocessing.process.BaseProcess, command: list[str]) -> None:
        self._process = process
        self.args = command

    @property
    def pid(self) -> int:
        pid = self._process.pid
        assert pid is not None, "a ForkedProcess wraps a started process"
        return pid

    @property
    def sentinel(self) -> int:
        """Readable once the process has ended (for ``multiprocessing.connection.wait``)."""
        return self._process.sentinel

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)  # join(None) returns only once it ended
        return self._process.exitcode


class ForkServer:
    """Starts hacrl CLI commands as forks of one pre-imported server process."""

    def __init__(self, modules: tuple[str, ...] = WORKER_MODULES) -> None:
        self._context: ForkServerContext = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(list(modules))

    def start_server(self, environment: dict[str, str] | None = None) -> None:
        """Start the server (it imports in the background); the first ``start`` waits for it.
        ``environment``: variables the server starts with on top of this process's, for what
        its imports read once (the OpenMP runtime's ``OMP_WAIT_POLICY``: runtime/cpus.py); a
        server already running (an earlier run in this Python process) keeps its own.

        The server (and multiprocessing's resource tracker, started with it) get /dev/null as
        stdout and stderr instead of this process's: they outlive `hacrl run` by their own
        teardown (about 1 s with torch loaded), and a reader of `hacrl run`'s output (a pipe,
        ``| tee``, a test capturing it) would wait for that too. Workers write to their logs."""
        from multiprocessing import forkserver

        with _stdio_to_devnull(), _environment(environment or {}):
            forkserver.ensure_running()

    @staticmethod
    def runs(command: list[str]) -> bool:
        return tuple(command[: len(HACRL_CLI)]) == HACRL_CLI

    def start(self, command: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess:
        if not self.runs(command):
            raise ValueError(f"the fork server runs hacrl CLI commands only, not {command[:3]}")
        arguments = list(command[len(HACRL_CLI) :])
        process = self._context.Process(
            target=_run_cli, args=(arguments, dict(env), str(log_path)), name=" ".join(arguments)
        )
        process.start()
        # Popen(start_new_session=True) returns after the child's setsid; a fork calls it first
        # thing, a moment after start() returns. Wait for it: a killpg in between (Ctrl-C at once,
        # a test holding the worker) found no such process group.
        pid = process.pid
        assert pid is not None, "set by start()"
        while process.exitcode is None:
            try:
                if os.getpgid(pid) == pid:
                    break
            except ProcessLookupError:
                break
            time.sleep(0.001)
        return ForkedProcess(process, command)


def fork_server() -> ForkServer | None:
    """The run's fork server, or None where it is turned off or the platform has no fork."""
    if os.environ.get(FORK_SERVER_ENV, "1") == "0" or "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    return ForkServer()


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set inside the block (for processes started there), as before after it."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _stdio_to_devnull() -> Iterator[None]:
    """File descriptors 1 and 2 point at /dev/null inside the block (for processes started there)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (devnull, *saved):
            os.close(fd)


def _run_cli(arguments: list[str], env: dict[str, str], log_path: str) -> None:
    """In the forked child: become the worker a fresh `python -m hacrl_core.cli ...` would be."""
    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [HACRL_CLI[0], *arguments]
    # The CLI module of the command line, looked up by its name as `python -m` does: the server
    # starts command lines and sits below the CLI that starts it (cli -> runtime -> forkserver), so
    # it never imports the CLI itself. The server preloaded the module (WORKER_MODULES).
    cli = importlib.import_module(HACRL_CLI[2])
    try:
        cli.console(arguments)  # ends the process as the `hacrl` executable does: atexit handlers, flush, os._exit
    finally:  # an exception (argparse's SystemExit too) ends it through multiprocessing instead, which skips them
        atexit._run_exitfuncs()
