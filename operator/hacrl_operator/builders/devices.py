"""Which containers may hold a GPU: the test behind ``NVIDIA_VISIBLE_DEVICES=void`` (container.py).

``void`` hides every GPU from a container, including one its device plugin allocated, so it
must go only where no GPU can be: a container that requests no GPU-like extended resource at all.
GPUs come under many names: ``nvidia.com/gpu``, MIG slices (``nvidia.com/mig-1g.5gb``), the
time-sliced or MPS-shared resources the NVIDIA plugin renames (``nvidia.com/gpu.shared`` or any
name its config gives, always in ``nvidia.com``), other vendors' (``amd.com/gpu``,
``gpu.intel.com/i915``, ``habana.ai/gaudi``), and GPU-sharing schedulers' (``volcano.sh/vgpu-number``,
``aliyun.com/gpu-mem``); a claim (``resources.claims``, Dynamic Resource Allocation) may be a GPU too.
Erring towards "may hold a GPU" only leaves the image's own setting, where erring the other way
hides a GPU the pod was given.
"""

from __future__ import annotations

from typing import Any

# Domains whose device plugins advertise only accelerators.
GPU_DOMAINS = ("nvidia.com", "amd.com", "gpu.intel.com", "habana.ai")


def gpu_like(resource: str) -> bool:
    """Whether an extended resource name is, or may be, a GPU (standard ones have no domain)."""
    domain, slash, name = resource.partition("/")
    return bool(slash) and (domain.lower() in GPU_DOMAINS or "gpu" in name.lower())


def _zero(quantity: Any) -> bool:
    try:
        return float(str(quantity)) == 0
    except ValueError:  # a suffixed quantity ("1k"): not zero
        return False


def may_hold_gpu(resources: Any) -> bool:
    """Whether a container with these ResourceRequirements may be given a GPU: a non-zero request
    or limit of a GPU-like resource, or any resource claim."""
    if not isinstance(resources, dict):
        return False
    if resources.get("claims"):
        return True
    return any(
        gpu_like(str(name)) and not _zero(quantity)
        for section in ("limits", "requests")
        if isinstance(resources.get(section), dict)
        for name, quantity in resources[section].items()
    )
