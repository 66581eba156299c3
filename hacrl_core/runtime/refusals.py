"""What `hacrl run` refuses about a spec before it writes anything, said by `hacrl validate` first.

``spec_refusals``: the spec's own models, built-in data sources and file store, the same on every
machine: `hacrl validate` refuses them (it said ok, and `hacrl run` ended at the last-resort
handler). ``installation_refusals``: what this installation lacks (an engine, a backend, a
tracker's package): `hacrl run` here refuses them, while a cluster's image may have them, so
`hacrl validate` only warns. Nothing here downloads or builds anything.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse


def spec_refusals(experiment) -> list[str]:
    from hacrl_core.models.preflight import model_problems

    return model_problems(experiment.spec) + builtin_source_problems(experiment.spec) + store_problems(experiment.spec)


def installation_refusals(experiment) -> list[str]:
    from hacrl_core.context import unsupported_settings
    from hacrl_core.learner.launcher import multi_node_problems

    return unsupported_settings(experiment) + multi_node_problems(experiment)


def builtin_source_problems(spec) -> list[str]:
    """``builtin://`` datasets are generated, so opening them is as cheap as parsing them."""
    from hacrl_core.data.report import open_dataset, spec_datasets

    problems = []
    for field_path, dataset in spec_datasets(spec.data):
        if dataset.source.startswith("builtin://"):
            try:
                open_dataset(spec.data, dataset)
            except ValueError as error:
                problems.append(f"spec.{field_path}.source: {error}")
    return problems


def store_problems(spec) -> list[str]:
    """A ``file://`` store whose folder, or one above it, is a file."""
    if not spec.store.uri.startswith("file://"):
        return []
    root = Path(unquote(urlparse(spec.store.uri).path))
    for folder in (root, *root.parents):
        if folder.exists():
            return (
                []
                if folder.is_dir()
                else [f"spec.store.uri: {folder} is a file, not a folder; give the store a folder"]
            )
    return []
