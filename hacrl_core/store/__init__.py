"""The trajectory store (docs/architecture.md, "The trajectory store"): object stores, commit markers, Parquet rows.

- ``objects``: the ``ObjectStore`` interface, ``open_object_store(uri)``; backends in
  ``file_store`` (``file://``) and ``s3_store`` (``s3://``, boto3).
- ``commit``: objects and directories visible only when complete (marker/manifest + sha256).
- ``trajectories``: tokenizer-neutral rollout and score rows in Parquet, as row dicts or as
  Arrow tables (the columnar path).
- ``layout`` + ``trajectory_store``: one experiment's keys and ``TrajectoryStore``.
- ``ownership``: the owner record that keeps one experiment out of another's prefix.
"""

from hacrl_core.store.commit import (
    dir_committed,
    get_committed,
    get_dir,
    is_committed,
    list_committed_dirs,
    put_committed,
    put_dir,
)
from hacrl_core.store.errors import (
    CorruptObject,
    ObjectNotFound,
    StoreError,
    StoreGone,
    StoreUnavailable,
)
from hacrl_core.store.file_store import FileObjectStore
from hacrl_core.store.objects import ObjectStore, open_object_store
from hacrl_core.store.s3_store import S3ObjectStore
from hacrl_core.store.trajectory_store import (
    TrajectoryStore,
    describe_prefix,
    open_experiment_store,
    open_trajectory_store,
)

__all__ = [
    "ROLLOUT_SCHEMA",
    "SCORE_SCHEMA",
    "CorruptObject",
    "FileObjectStore",
    "ObjectNotFound",
    "ObjectStore",
    "S3ObjectStore",
    "StoreError",
    "StoreGone",
    "StoreUnavailable",
    "TrajectoryStore",
    "describe_prefix",
    "dir_committed",
    "get_committed",
    "get_dir",
    "is_committed",
    "list_committed_dirs",
    "open_experiment_store",
    "open_object_store",
    "open_trajectory_store",
    "put_committed",
    "put_dir",
    "rollouts_from_parquet",
    "rollouts_table",
    "rollouts_table_from_parquet",
    "rollouts_table_to_parquet",
    "rollouts_to_parquet",
    "scores_from_parquet",
    "scores_table",
    "scores_table_from_parquet",
    "scores_table_to_parquet",
    "scores_to_parquet",
]

# The Parquet codec (pyarrow, numpy) loads on first use, so that importing the store to read JSON
# objects (the operator) stays light.
_LAZY = {name for name in __all__ if name.endswith(("_SCHEMA", "_parquet", "_table"))}


def __getattr__(name: str):
    if name in _LAZY:
        from hacrl_core.store import trajectories

        return getattr(trajectories, name)
    raise AttributeError(f"module 'hacrl_core.store' has no attribute {name!r}")
