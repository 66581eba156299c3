"""Reading a spec: from a file or a document to an ``Experiment``, every problem as one line that
names its field; YAML that would exhaust memory refused; the rendered spec written back."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hacrl_core.file_kind import is_pipe_or_socket, not_a_regular_file
from hacrl_core.spec.experiment import Experiment

_NESTED_FIELD = re.compile(r"^([A-Za-z][\w\[\]\.]*): (.*)$", re.S)


class SpecError(ValueError):
    """A spec that does not validate; ``errors`` holds one line per problem, each naming its field."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: invalid experiment spec\n" + "\n".join(f"  - {e}" for e in errors))


def format_validation_error(error: ValidationError) -> list[str]:
    """Pydantic errors as `field.path[0].sub: message` lines, paths in the YAML's own (camelCase) keys."""
    lines = []
    for item in error.errors():
        path = ""
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = item["msg"].removeprefix("Value error, ")
        # Model-level validators name the nested field themselves ("agents[1].name: ..."): join it on.
        nested = _NESTED_FIELD.match(message) if item["type"] == "value_error" else None
        if nested:
            path = f"{path}.{nested.group(1)}" if path else nested.group(1)
            message = nested.group(2)
        if item["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; see `hacrl crd` or docs/spec.md for the allowed fields)"
        lines.append(f"{path or '<document>'}: {message}")
    return lines


def parse_experiment(document: Any, source: str = "<spec>") -> Experiment:
    if not isinstance(document, dict):
        raise SpecError(
            source,
            [f"<document>: expected a mapping with apiVersion, kind, metadata and spec, got {type(document).__name__}"],
        )
    try:
        return Experiment.model_validate(document)
    except ValidationError as error:
        raise SpecError(source, format_validation_error(error)) from None


# A spec is a few KB; Kubernetes stores objects up to ~1.5 MB. The node limit stops a "billion
# laughs" document (aliases of aliases) that is small on disk but explodes when expanded.
MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_NODES = 100_000


def _expanded_nodes(root: yaml.Node) -> int:
    """Nodes of the document with every alias expanded, counted without expanding (memoised)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [item for pair in node.value for item in pair]
        if children_done or not children:
            sizes[id(node)] = 1 + sum(sizes.get(id(child), 0) for child in children)
        else:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def _duplicate_keys(root: yaml.Node) -> list[str]:
    """``path: key`` of every key that a mapping of the document holds twice (YAML would keep the
    last silently); the merge key ``<<`` excepted."""
    found, seen_nodes = [], set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is not None and key != "<<":
                    if key in keys:
                        found.append(f"{path}.{key}" if path else key)
                    keys.add(key)
                stack.append((value_node, f"{path}.{key}" if path else str(key)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{index}]") for index, item in enumerate(node.value))
    return sorted(set(found))


def load_spec_document(text: str, source: str) -> Any:
    """The YAML document of a spec, refusing what would exhaust memory or the stack."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(
            source,
            [
                f"<document>: {len(text)} characters; an experiment spec is at most {MAX_SPEC_BYTES} (is this the right file?)"
            ],
        )
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        nodes = _expanded_nodes(node)
        if nodes > MAX_SPEC_NODES:
            raise SpecError(
                source,
                [
                    f"<document>: {nodes} values once YAML aliases are expanded (at most {MAX_SPEC_NODES}); write the spec without nested aliases"
                ],
            )
        duplicates = _duplicate_keys(node)
        if duplicates:
            raise SpecError(
                source, [f"{path}: the key is given twice (YAML keeps only the last); keep one" for path in duplicates]
            )
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise SpecError(source, [f"<document>: not valid YAML: {error}"]) from None
    except RecursionError:
        raise SpecError(source, ["<document>: nested too deeply to be an experiment spec"]) from None
    finally:
        loader.dispose()


#: `hacrl run` sets it on each worker: the sha256 of the rendered spec file the run started the
#: worker with. The worker refuses a file with other contents: the spec it trains is the run's.
SPEC_DIGEST_ENV = "HACRL_SPEC_SHA256"


def read_spec_bytes(path: str | Path) -> bytes:
    """The bytes of a spec file, reading at most ``MAX_SPEC_BYTES`` + 1 (a huge file or
    /dev/zero is refused without being read); ``OSError`` when it cannot be read."""
    if is_pipe_or_socket(Path(path)):  # open() would wait for a writer: `hacrl validate` hung
        raise SpecError(str(path), [f"<document>: {not_a_regular_file(Path(path))}; give the spec file itself"])
    with open(path, "rb") as handle:
        data = handle.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(
            str(path),
            [
                f"<document>: larger than {MAX_SPEC_BYTES} bytes; an experiment spec is at most {MAX_SPEC_BYTES} bytes (is this the right file?)"
            ],
        )
    return data


def spec_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_experiment(path: str | Path, *, sha256: str | None = None) -> Experiment:
    """The experiment in the spec file ``path``; with ``sha256``, only if the file's bytes have that
    digest (``SPEC_DIGEST_ENV``: a worker's pinned spec)."""
    data = read_spec_bytes(path)
    if sha256 is not None and spec_digest(data) != sha256:
        raise SpecError(
            str(path),
            [
                f"<document>: this is not the spec this worker was started with (sha256 {spec_digest(data)[:12]}..., expected "
                f"{sha256[:12]}...): something replaced the file since its run started; the worker stops rather than train "
                "another experiment. Resume the run with `hacrl run --resume <spec>`"
            ],
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(
            str(path), [f"<document>: not UTF-8 text (byte {error.start}): save the spec as UTF-8 YAML"]
        ) from None
    return parse_experiment(load_spec_document(text, str(path)), str(path))


def dump_experiment(experiment: Experiment) -> str:
    """The experiment as YAML with camelCase keys, defaults filled in (the rendered spec)."""
    data = experiment.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.pop("status", None)
    return yaml.safe_dump(data, sort_keys=False)
