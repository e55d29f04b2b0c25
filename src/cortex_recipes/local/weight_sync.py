"""Weight sync: the training sub-job's weights (or LoRA adapter) into sampling sub-jobs.

Invariants:
- The payload is checked before anything runs: the source is the job's training sub-job, every
  target is a sampling sub-job of the job, and the format matches how each target was created
  (``lora`` only into a sub-job with a peft_config; full weights only into one without).
- One sync is one safetensors file: the source writes it, every target loads it directly onto
  its own device, and it is removed afterwards. It goes to a tmpfs (``/dev/shm``) when that has
  room for it, so a GPU-to-GPU sync never touches a disk; otherwise under the job's state dir.
- Each sync gets the next ``weight_version`` of the job; the result reports it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from cortex_recipes.local.dispatch import Dispatcher, route, worker_result
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.jobs import Job
from cortex_recipes.local.specs import abridge, reject_unknown_keys

WEIGHT_FORMATS = ("vllm", "hf", "lora")
PAYLOAD_KEYS = ("source_sub_job_id", "target_sub_job_ids", "weight_format")
TMPFS = Path("/dev/shm")
# Bytes per parameter of the largest dtype a sync file holds (fp32), with 2x headroom for the
# file being written while the previous one is still open.
_BYTES_PER_PARAM = 4 * 2


def sync_directory(job_dir: Path, n_parameters: int) -> Path:
    """Where a sync file of a model with ``n_parameters`` goes: tmpfs if it fits, else disk."""
    needed = n_parameters * _BYTES_PER_PARAM
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK):
        stats = os.statvfs(TMPFS)
        if stats.f_bavail * stats.f_frsize > needed:
            return Path(tempfile.mkdtemp(prefix="cortex-weight-sync-", dir=TMPFS))
    directory = job_dir / "weight-sync"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def start_weight_sync(
    dispatcher: Dispatcher,
    job: Job,
    job_dir: Path,
    sub_job_id: Any,
    sub_job_type: Any,
    payload: Any,
) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise BackendError("weight-sync needs a payload object")
    reject_unknown_keys(payload, PAYLOAD_KEYS, "weight-sync payload")
    source = payload.get("source_sub_job_id")
    targets = payload.get("target_sub_job_ids")
    weight_format = payload.get("weight_format") or "vllm"
    if weight_format not in WEIGHT_FORMATS:
        raise BackendError(
            f"weight_format={abridge(weight_format)}; accepted: {', '.join(WEIGHT_FORMATS)}"
        )
    if not isinstance(source, str):
        raise BackendError("weight-sync needs payload.source_sub_job_id")
    source_spec = route(
        job, "weight-sync", sub_job_id or source, sub_job_type, ("training",), ("training",)
    )
    if source_spec.sub_job_id != source:
        raise BackendError(
            f"weight-sync routed to {source_spec.sub_job_id} but source_sub_job_id is {source}"
        )
    if not isinstance(targets, list) or not targets or len(targets) > len(job.specs):
        raise BackendError("weight-sync needs a non-empty payload.target_sub_job_ids list")
    target_specs = [job.sub_job(t) for t in targets]
    for spec in target_specs:
        if spec.job_type != "sampling":
            raise BackendError(
                f"weight-sync target {spec.sub_job_id} is a {spec.job_type} sub-job; "
                "targets must be sampling sub-jobs"
            )
        if weight_format == "lora" and spec.lora is None:
            raise BackendError(
                f"weight_format='lora' needs target {spec.sub_job_id} to be created with "
                "inference_config.peft_config"
            )
        if weight_format != "lora" and spec.lora is not None:
            raise BackendError(
                f"target {spec.sub_job_id} serves a LoRA adapter; use weight_format='lora'"
            )
    if weight_format == "lora" and source_spec.lora is None:
        raise BackendError("weight_format='lora' needs a training sub-job with a peft_config")
    with job.lock:
        job.weight_version += 1
        version = job.weight_version
    n_parameters = int((job.workers[source].info or {}).get("n_parameters") or 0)

    def run() -> dict[str, Any]:
        directory = sync_directory(job_dir, n_parameters)
        path = directory / f"v{version}.safetensors"
        header = {"path": str(path), "weight_format": weight_format}
        try:
            reply = job.workers[source].submit({"op": "export_weights", **header}).result()
            exported = worker_result(reply, f"export from {source}")
            futures = {
                t.sub_job_id: job.workers[t.sub_job_id].submit(
                    {"op": "import_weights", "weight_version": version, **header}
                )
                for t in target_specs
            }
            for target, future in futures.items():
                worker_result(future.result(), f"import into {target}")
            return {
                "job_id": job.job_id,
                "source_sub_job_id": source,
                "target_sub_job_ids": list(futures),
                "weight_format": weight_format,
                "weight_version": version,
                "global_steps": exported["global_steps"],
                "bytes": exported["bytes"],
                "via": "tmpfs" if directory.parent == TMPFS else "disk",
            }
        finally:
            path.unlink(missing_ok=True)
            if directory.parent == TMPFS:
                directory.rmdir()

    request = dispatcher.in_server(job, source, "weight_sync", run)
    return {"request_id": request.request_id, "job_id": job.job_id}
