"""A worker pod's volumes and the worker container's mounts: the rendered spec (the experiment's
ConfigMap), emptyDirs for everything it writes (its root filesystem is read-only), shared memory,
and the agent's model cache claim when the spec names one."""

from __future__ import annotations

from typing import Any

from hacrl_core.spec import Experiment
from hacrl_operator.builders.metadata import configmap_name

SPEC_MOUNT = "/etc/hacrl"
SPEC_FILE = "spec.yaml"
SPEC_PATH = f"{SPEC_MOUNT}/{SPEC_FILE}"
WORK_DIR = "/var/lib/hacrl"  # working directory: relative file:// stores land here
CACHE_DIR = "/var/cache/hacrl"  # HF, torch and triton caches (root filesystem is read-only)
# $HACRL_CACHE/models: hub downloads, tiny builds, s3:// models (hacrl_core/models/uri.py), and
# HF_HOME beneath it: the one directory spec.modelCache's claim is mounted at (else the emptyDir).
MODEL_CACHE_DIR = f"{CACHE_DIR}/models"
MODEL_CACHE_VOLUME = "model-cache"


def worker_volume_mounts() -> list[dict[str, Any]]:
    """The worker container's mounts of the volumes of ``worker_volumes``."""
    return [
        {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "work", "mountPath": WORK_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]


def worker_volumes(experiment: str) -> list[dict[str, Any]]:
    """The volumes of every worker pod of ``experiment``."""
    return [
        {
            "name": "spec",
            "configMap": {"name": configmap_name(experiment), "items": [{"key": SPEC_FILE, "path": SPEC_FILE}]},
        },
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        {"name": "work", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]


def model_cache_mount(experiment: Experiment, agent: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (volume, volumeMount) of ``agent``'s model cache claim (``agents[].modelCache``, else
    ``spec.modelCache``) at MODEL_CACHE_DIR, inside the ``cache`` emptyDir; None without one."""
    cache = experiment.spec.model_cache_of(agent)
    if cache is None:
        return None
    return (
        {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.claim_name}},
        {"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_DIR},
    )


def mount_model_cache(pod_spec: dict[str, Any], container: dict[str, Any], experiment: Experiment, agent: str) -> None:
    """Add ``agent``'s model cache claim (``model_cache_mount``), if any, to the pod and its worker."""
    model_cache = model_cache_mount(experiment, agent)
    if model_cache:
        volume, mount = model_cache
        pod_spec["volumes"].append(volume)
        container["volumeMounts"].append(mount)
