"""What `hacrl validate` and `hacrl run` say about the spec's models before anything is built,
downloaded or started.

A local model folder without ``config.json``, or with a safetensors file cut short, passed the
pre-flight and failed in the worker: a traceback naming no file, restarted into the same error,
the store left claimed. A ``tiny://`` URI is parsed here as its build parses it. Hub ids and
``s3://`` prefixes are checked when `hacrl run` fetches them.
"""

from __future__ import annotations

import json
from pathlib import Path

from hacrl_core.models.tiny_uri import parse_tiny_uri
from hacrl_core.models.uri import _HUB_ID

#: A safetensors header larger than this is not a header (real ones are kilobytes).
MAX_HEADER_BYTES = 100 * 1024 * 1024


def model_problems(spec) -> list[str]:
    """``spec.agents[i].model: <what is wrong>`` for each agent's model that cannot load."""
    problems = []
    for index, agent in enumerate(spec.agents):
        problem = model_problem(agent.model)
        if problem:
            problems.append(f"spec.agents[{index}].model: {problem}")
    return problems


def model_problem(uri: str) -> str | None:
    if uri.startswith("tiny://"):
        try:
            parse_tiny_uri(uri)
        except ValueError as error:
            return str(error)
        return None
    if uri.startswith("s3://") or ("://" in uri and not uri.startswith("file://")):
        return None  # fetched by `hacrl run`; an unknown scheme is refused by the spec
    local = Path(uri.removeprefix("file://")).expanduser()
    if local.is_dir():
        return folder_problem(local)
    if uri.startswith(("/", ".", "~", "file://")) or not _HUB_ID.match(uri):
        return f"{uri!r}: no such directory (and not a hub id of the form org/name)"
    return None


def folder_problem(folder: Path) -> str | None:
    config = folder / "config.json"
    if not config.is_file():
        return f"{folder} holds no config.json: not a model folder (save one with save_pretrained)"
    try:
        json.loads(config.read_bytes())
    except (ValueError, RecursionError) as error:
        return f"{config} is not valid JSON ({str(error)[:120]})"
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not list(folder.glob("*.bin")):
        return f"{folder} holds no weights (*.safetensors)"
    for path in weights:
        problem = safetensors_problem(path)
        if problem:
            return f"{path}: {problem}; replace the file with a whole copy"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (its header, and the size the header says)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a safetensors header"
        length = int.from_bytes(head, "little")
        if length > min(size - 8, MAX_HEADER_BYTES):
            return f"its header claims {length} bytes of {size}: not safetensors, or cut short"
        try:
            header = json.loads(handle.read(length))
            end = max(
                (int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"), default=0
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
            return "its header is not a safetensors header"
    if 8 + length + end != size:
        return f"{size} bytes where its header describes {8 + length + end}: cut short or corrupt"
    return None
