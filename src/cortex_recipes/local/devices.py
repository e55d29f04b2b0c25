"""Where each sub-job runs: the device mode, what CUDA the server can see, and the placement plan.

Invariants:
- ``cpu`` places every sub-job on the CPU; ``cuda`` places every sub-job on a GPU and fails
  job creation when none is visible; ``auto`` (the default) places a sub-job on a GPU when CUDA
  is visible and the sub-job asks for GPUs (``n_gpus >= 1``, as the hosted service reads it).
- With several GPUs, a job's sub-jobs go to distinct devices where they can: the training
  sub-job first, each one to the GPU holding the fewest live sub-jobs (lowest index on a tie).
  With one GPU they share it.
- The server never creates a CUDA context: it only counts devices. Memory is checked by the
  worker that loads the model (it has to create a context anyway).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cortex_recipes.local.errors import BackendError

DEVICE_ENV = "CORTEX_RECIPES_DEVICE"
DEVICE_MODES = ("auto", "cpu", "cuda")
CPU = "cpu"


def device_mode(value: str | None) -> str:
    """The mode asked for: ``value``, else ``$CORTEX_RECIPES_DEVICE``, else ``auto``."""
    raw = value if value is not None else os.environ.get(DEVICE_ENV) or "auto"
    mode = str(raw).strip().lower()
    if mode not in DEVICE_MODES:
        where = "device" if value is not None else DEVICE_ENV
        raise ValueError(f"{where}={raw!r}; accepted: {', '.join(DEVICE_MODES)}")
    return mode


def visible_cuda_devices() -> int:
    """How many CUDA devices torch sees in this process (0 without CUDA); creates no context."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of the backend
        return 0
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.device_count())


@dataclass(frozen=True)
class PlacementRequest:
    """What placement needs to know about one sub-job."""

    sub_job_id: str
    job_type: str
    n_gpus: int


def plan_placement(
    requests: Sequence[PlacementRequest],
    mode: str,
    cuda_count: int,
    in_use: Mapping[int, int] | None = None,
) -> dict[str, str]:
    """``{sub_job_id: "cpu" | "cuda:<i>"}`` for one job's sub-jobs.

    ``in_use`` counts the live sub-jobs already on each GPU (from earlier jobs).
    """
    if mode not in DEVICE_MODES:
        raise ValueError(f"mode={mode!r}; accepted: {', '.join(DEVICE_MODES)}")
    if mode == "cuda" and cuda_count == 0:
        raise BackendError(
            "device='cuda' was asked for but this machine has no visible CUDA device; "
            "use device='auto' or 'cpu' (serve --device, CORTEX_RECIPES_DEVICE)"
        )
    load = {i: int((in_use or {}).get(i, 0)) for i in range(cuda_count)}
    # The training sub-job is placed first, so it gets the least-loaded GPU.
    ordered = sorted(requests, key=lambda r: (r.job_type != "training",))
    plan: dict[str, str] = {}
    for request in ordered:
        on_gpu = cuda_count > 0 and (mode == "cuda" or (mode == "auto" and request.n_gpus >= 1))
        if not on_gpu:
            plan[request.sub_job_id] = CPU
            continue
        index = min(load, key=lambda i: (load[i], i))
        load[index] += 1
        plan[request.sub_job_id] = f"cuda:{index}"
    return {r.sub_job_id: plan[r.sub_job_id] for r in requests}


def gpu_index(device: str) -> int | None:
    """``3`` for ``cuda:3``; None for the CPU."""
    if device == CPU:
        return None
    prefix, _, index = device.partition(":")
    if prefix != "cuda" or not index.isdigit():
        raise ValueError(f"device={device!r} is not 'cpu' or 'cuda:<index>'")
    return int(index)


def worker_visible_devices(device: str, parent_visible: str | None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a worker placed on ``device`` (it then uses ``cuda:0``).

    ``parent_visible`` is the server's own ``CUDA_VISIBLE_DEVICES``: index ``i`` of the server's
    numbering is entry ``i`` of that list. A CPU worker sees no GPU at all.
    """
    index = gpu_index(device)
    if index is None:
        return ""
    if parent_visible:
        entries = [e.strip() for e in parent_visible.split(",") if e.strip()]
        if index >= len(entries):
            raise ValueError(f"device {device} is not in CUDA_VISIBLE_DEVICES={parent_visible!r}")
        return entries[index]
    return str(index)


def resolve_dtype(dtype: str | None, device: str) -> str:
    """The dtype a sub-job runs in: the one asked for, else bfloat16 on a GPU, float32 on CPU."""
    if dtype:
        return dtype
    return "bfloat16" if device != CPU else "float32"
