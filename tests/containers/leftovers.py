"""Each container-e2e run in podman state of its own, and the removal of what earlier runs left.

A run keeps its containers, pods, volumes, podman database and lock files in one folder,
``$HACRL_CONTAINER_CACHE/runs/<run>`` (scripts/containers-env.sh writes its storage.conf and
containers.conf); the images come read-only from the shared store that scripts/images-local.sh
fills. Pod and container names repeat from run to run (the operator derives them from the
experiment), so a container an earlier run left in one store, running, exited or only in storage,
made every later ``kube play`` of that pod fail with "name already in use". Now:

- ``sweep``, before a run: every run folder whose owner process is gone (finished, failed, killed
  with SIGKILL) is emptied: its containers stopped and removed, its processes killed if podman
  cannot do it in time, its mounts released, the folder deleted; the shared store loses any
  container (a ``Storage`` one included), pod or volume it holds (it holds images only between
  builds) and gets its lock numbers reassigned (``podman system renumber``), so a lock table that
  disagrees with the database cannot hang the build's own ``podman run``. One line says what went.
- ``clean RUN``, when a run ends: the same removal for its own folder.

    python -m tests.containers.leftovers sweep [--keep RUN]
    python -m tests.containers.leftovers clean RUN
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

OWNER_FILE = "owner"
# Seconds for one podman call on a store; removing a container stops it first (--time 0: at once).
PODMAN_DEADLINE = 60.0


def cache_dir() -> Path:
    return Path(os.environ.get("HACRL_CONTAINER_CACHE") or Path.home() / ".cache" / "hacrl-containers")


def runs_dir() -> Path:
    return cache_dir() / "runs"


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if it is gone: with the
    pid it names one process for good (a pid alone is reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def claim(run: Path, pid: int) -> None:
    """Marks ``run`` as owned by process ``pid`` while that process lives."""
    run.mkdir(parents=True, exist_ok=True)
    (run / OWNER_FILE).write_text(f"{pid} {process_start(pid)}\n", encoding="utf-8")


def owner_alive(run: Path) -> bool:
    try:
        pid, start = (run / OWNER_FILE).read_text(encoding="utf-8").split()
    except (OSError, ValueError):
        return False
    return process_start(int(pid)) == start


@dataclasses.dataclass
class Store:
    """One podman store, named by the folder of its storage.conf and containers.conf."""

    config: Path

    def podman(self, *args: str, timeout: float = PODMAN_DEADLINE) -> subprocess.CompletedProcess[str] | None:
        """The call's result, or None if it did not return within ``timeout`` s (it is killed)."""
        env = os.environ | {
            "CONTAINERS_STORAGE_CONF": str(self.config / "storage.conf"),
            "CONTAINERS_CONF": str(self.config / "containers.conf"),
        }
        try:
            return subprocess.run(
                ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return None

    def lines(self, *args: str) -> list[str] | None:
        result = self.podman(*args)
        if result is None or result.returncode != 0:
            return None
        return [line.strip() for line in result.stdout.splitlines() if line.strip()]

    def inventory(self) -> dict[str, list[str]] | None:
        """{"pods", "containers", "volumes": names}; containers in storage only are marked so."""
        pods = self.lines("pod", "ps", "--format", "{{.Name}}")
        containers = self.lines("ps", "--all", "--external", "--format", "{{.Names}}\t{{.Status}}")
        volumes = self.lines("volume", "ls", "--format", "{{.Name}}")
        if pods is None or containers is None or volumes is None:
            return None
        named = [
            f"{name} (in storage)" if status.lower().startswith("storage") else name
            for name, _, status in (line.partition("\t") for line in containers)
        ]
        return {"pods": pods, "containers": named, "volumes": volumes}

    def remove_all(self) -> bool:
        """Every pod, container (in storage only too) and volume of the store removed; False if
        podman failed or did not answer in time."""
        done = True
        for args in (("pod", "rm", "--all", "--force", "--time", "0"), ("rm", "--all", "--force", "--time", "0")):
            result = self.podman(*args)
            done = done and result is not None and result.returncode == 0
        # `rm --all` leaves containers that exist only in storage (a build's, or one whose
        # creation was cut short): by name, with --storage.
        for line in self.lines("ps", "--all", "--external", "--format", "{{.ID}}") or []:
            result = self.podman("rm", "--force", "--storage", line)
            done = done and result is not None
        result = self.podman("volume", "rm", "--all", "--force")
        return done and result is not None and result.returncode == 0


def describe(inventory: dict[str, list[str]]) -> str:
    parts = [
        f"{len(names)} {kind[:-1] if len(names) == 1 else kind} ({', '.join(names)})"
        for kind, names in inventory.items()
        if names
    ]
    return "; ".join(parts) or "nothing"


def container_ids(run: Path) -> list[str]:
    """Ids of the containers a run's store holds (its overlay-containers folders)."""
    folder = run / "storage" / f"{os.environ.get('HACRL_CONTAINER_STORAGE_DRIVER', 'overlay')}-containers"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def processes_naming(run: Path, *, conmon: bool) -> set[int]:
    """Processes whose arguments name the run's folder: its e2e driver and SeaweedFS (their work
    folder is in it) and, with ``conmon``, podman's container monitors (their paths are)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                args = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(run) in args and (conmon or "conmon" not in args.split(" ", 1)[0]):
                pids.add(int(proc.name))
    pids.discard(os.getpid())
    return pids


def kill(pids: set[int]) -> int:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def kill_processes(run: Path) -> int:
    """SIGKILL to every process of the run's containers (found by their cgroups, which carry the
    container id) and to every process naming the run's folder: the fallback when podman itself
    does not answer. Returns how many were signalled."""
    pids = processes_naming(run, conmon=True)
    cgroups = Path("/sys/fs/cgroup")
    for cid in container_ids(run):
        for hierarchy in (cgroups / "pids", cgroups / "memory", cgroups / "unified", cgroups):
            found = set()
            for procs in hierarchy.glob(f"**/*{cid}*/cgroup.procs"):
                try:
                    found |= {int(p) for p in procs.read_text().split()}
                except OSError:
                    continue
            if found:
                pids |= found
                break
    return kill(pids)


def release_mounts(run: Path) -> None:
    """Lazily unmount whatever is still mounted under ``run`` (deepest first), so it can be deleted."""
    prefix = str(run.resolve()) + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def clean_run(run: Path) -> str:
    """Empties and deletes one run's folder; returns what it held, in words."""
    store = Store(run / "config")
    held = "nothing"
    # A killed run's driver outlives its script (it would play the pods again) and so does its
    # SeaweedFS: gone first. podman stops the containers below.
    orphans = kill(processes_naming(run, conmon=False))
    if (store.config / "storage.conf").is_file():
        inventory = store.inventory()
        held = describe(inventory) if inventory is not None else "podman did not answer"
        if inventory is None or not store.remove_all():
            killed = kill_processes(run)
            held += f"; podman could not remove it all, {killed} processes killed"
    if orphans:
        held += f"; {orphans} processes of its own killed"
    release_mounts(run)
    shutil.rmtree(run, ignore_errors=True)
    if run.exists():  # a mount the lazy unmount has not let go of yet
        release_mounts(run)
        shutil.rmtree(run, ignore_errors=True)
    return held


def sweep(keep: Path | None = None) -> str:
    """Removes the leftovers of every earlier run (see the module docstring); returns one line."""
    removed = []
    if runs_dir().is_dir():
        for run in sorted(runs_dir().iterdir()):
            if (keep is not None and run.resolve() == keep.resolve()) or owner_alive(run):
                continue
            removed.append(f"{run.name}: {clean_run(run)}")
    shared = Store(cache_dir() / "config")
    if (shared.config / "storage.conf").is_file():
        inventory = shared.inventory()
        if inventory is None:
            removed.append("shared store: podman did not answer")
        elif any(inventory.values()):
            shared.remove_all()
            removed.append(f"shared store: {describe(inventory)}")
        # Lock numbers handed out again from the database (cheap: the store holds images only).
        renumbered = shared.podman("system", "renumber")
        if renumbered is None or renumbered.returncode != 0:
            removed.append(
                "shared store: podman system renumber failed: "
                + ("no answer" if renumbered is None else renumbered.stderr.strip()[-300:])
            )
    return "leftovers of earlier runs removed: " + ("; ".join(removed) if removed else "none")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sweep_parser = commands.add_parser("sweep", help="remove what earlier runs left")
    sweep_parser.add_argument("--keep", type=Path, help="a run folder to leave alone (the current run's)")
    clean_parser = commands.add_parser("clean", help="remove one run's containers and folder")
    clean_parser.add_argument("run", type=Path)
    claim_parser = commands.add_parser("claim", help="mark a run folder as owned by a process")
    claim_parser.add_argument("run", type=Path)
    claim_parser.add_argument("--pid", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "sweep":
        print(f"container-e2e: {sweep(args.keep)}", file=sys.stderr)
    elif args.command == "clean":
        held = clean_run(args.run)
        print(f"container-e2e: run folder {args.run.name} removed (it held {held})", file=sys.stderr)
    else:
        claim(args.run, args.pid)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
