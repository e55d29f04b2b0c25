"""The job registry: create, describe, cancel and fail jobs; one worker per sub-job.

Invariants:
- A job moves ``pending -> running`` when every worker is ready, ``-> failed`` when one cannot
  start or dies (the reason names the sub-job and how its worker died), ``-> cancelled`` on a
  user cancel. A job that is not running accepts no data-plane request (409 while it starts,
  410 once it has ended, with the reason).
- In hosted-conformance mode (:mod:`cortex_recipes.local.hosted`) a new job walks ``pending ->
  placing`` (its workers are being started) ``-> initializing`` (they load their models) ``->
  running``, each state lasting at least :data:`HOSTED_STATE_MIN_S` so a poller sees it
  (``hosted-job-states``); ``idle_timeout_seconds`` / ``pending_timeout_seconds`` are checked
  against the hosted ranges, and a running job with no request on its paths and no unfinished
  request for ``idle_timeout_seconds`` (default 1800; 0 never) ends ``terminated``
  (``idle-timeout``, :mod:`~cortex_recipes.local.idle`).
  The default mode ignores both fields.
- When a job fails, is cancelled or is terminated, all its workers are stopped (their memory,
  GPU memory included, is freed) and its unfinished requests are settled: ``failed`` with the
  worker's (or the idle timeout's) reason, ``cancelled`` after a cancel. Other jobs are
  untouched.
- Each sub-job's device is decided here once, by :func:`devices.plan_placement`, and reported
  by ``describe`` together with the dtype it runs in.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cortex_recipes.local import bodies, devices, hosted, idle
from cortex_recipes.local.checkpoints import CheckpointStore
from cortex_recipes.local.chunks import ChunkAssembler
from cortex_recipes.local.cores import CoreBalancer
from cortex_recipes.local.errors import BackendError, Conflict, NotFound
from cortex_recipes.local.request_store import POLL_HOLD_S, RequestStore
from cortex_recipes.local.specs import SubJobSpec, WorkerSpec, abridge, parse_sub_jobs
from cortex_recipes.local.worker_handles import WorkerHandle
from cortex_recipes.local.worker_spawn import (
    Spare,
    SparePool,
    spares_enabled,
    worker_env,
)
from cortex_recipes.local.zygote import Zygote
from cortex_recipes.models import FIXTURE_MODELS, ModelNotAvailableError, resolve_model_path

log = logging.getLogger(__name__)
# Hosted mode: the least time each starting state lasts, so that a poller sees the walk
# (hosted placement and start-up take seconds to minutes).
HOSTED_STATE_MIN_S = 0.5
STARTING = ("pending", "placing", "initializing")
ENDED = ("failed", "cancelled", "terminated")


@dataclass
class Job:
    job_id: str
    specs: list[SubJobSpec]
    created_at: float
    requests: RequestStore
    devices: dict[str, str]
    workers: dict[str, WorkerHandle] = field(default_factory=dict)
    status: str = "pending"
    reason: str = ""
    chunks: ChunkAssembler = field(default_factory=ChunkAssembler)
    lock: threading.RLock = field(default_factory=threading.RLock)
    weight_version: int = 0
    # Rows of generate requests not yet settled, per sampling sub-job (the 429 bound).
    sampler_rows: dict[str, int] = field(default_factory=dict)
    # Hosted mode: seconds without a request before the job ends terminated (0: never), the
    # monotonic time of its last request, and when its status last changed.
    idle_timeout_s: int = 0
    last_request: float = field(default_factory=time.monotonic)
    status_since: float = field(default_factory=time.monotonic)

    def sub_job(self, sub_job_id: Any) -> SubJobSpec:
        for spec in self.specs:
            if spec.sub_job_id == sub_job_id:
                return spec
        raise BackendError(
            f"sub_job_id={abridge(sub_job_id)} is not part of job {self.job_id}; sub-jobs: "
            f"{', '.join(s.sub_job_id for s in self.specs)}"
        )

    def of_type(self, job_type: str) -> list[SubJobSpec]:
        return [s for s in self.specs if s.job_type == job_type]

    def vocab_size(self, sub_job_id: str) -> int | None:
        return (self.workers[sub_job_id].info or {}).get("vocab_size")

    @property
    def finished(self) -> bool:
        return self.status in ENDED


class JobRegistry:
    """Every job of one server process."""

    def __init__(
        self,
        state_dir: Path,
        *,
        device: str = "auto",
        threads: int | None = None,
        result_chunk_bytes: int = 8 * 1024 * 1024,
        poll_wait_s: float = POLL_HOLD_S,
        hosted: bool = False,
    ):
        self.hosted = hosted  # hosted-conformance mode (cortex_recipes.local.hosted)
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.device_mode = devices.device_mode(device)
        self.cuda_count = devices.visible_cuda_devices()
        self.threads = threads
        self.cores = CoreBalancer()
        self.result_chunk_bytes = result_chunk_bytes
        self.poll_wait_s = poll_wait_s
        self.checkpoints = CheckpointStore(self.state_dir)
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="job-start")
        self.spares = SparePool(
            self.state_dir / "spares",
            enabled=spares_enabled(),
            quiet=self._quiet,
        )
        self._stopped = threading.Event()
        if hosted:
            self.idle_clock_scale = idle.idle_clock_scale()
            if self.idle_clock_scale != 1.0:
                log.warning(
                    "$%s=%g: idle time counts %g times fast (for tests only)",
                    idle.IDLE_CLOCK_SCALE_ENV,
                    self.idle_clock_scale,
                    self.idle_clock_scale,
                )
            threading.Thread(target=self._watch_idle, name="idle-timeout", daemon=True).start()
        log.info("device mode %s; %d CUDA device(s) visible", self.device_mode, self.cuda_count)

    def _quiet(self) -> bool:
        """No job placing or starting its workers, and no worker starting or running a command
        (when a replacement spare may start: SparePool)."""
        with self._lock:
            jobs = list(self.jobs.values())
        for job in jobs:
            with job.lock:
                if job.finished:
                    continue
                if job.status != "running" or not all(w.quiet for w in job.workers.values()):
                    return False
        return True

    def start_spare(self, early: Sequence[Spare] = (), zygote: Zygote | None = None) -> None:
        """Pre-start a CPU worker when sub-jobs will run on the CPU (no GPU visible, or device
        mode ``cpu``); on a GPU machine the first sub-job's placement decides (SparePool).
        ``early`` / ``zygote``: what the server started before importing torch
        (``early_workers``): spares, or the zygote that forks them."""
        self.spares.adopt(list(early))
        if zygote is not None:
            self.spares.use_zygote(zygote)
        if self.device_mode == devices.CPU or self.cuda_count == 0:
            self.spares.replenish(worker_env(devices.worker_visible_devices(devices.CPU, None)))

    def job_dir(self, job_id: str) -> Path:
        return self.state_dir / "jobs" / job_id

    # -- create ------------------------------------------------------------------------------

    def _gpu_load(self) -> Counter:
        load: Counter = Counter()
        for job in self.jobs.values():
            if job.finished:
                continue
            for device in job.devices.values():
                index = devices.gpu_index(device)
                if index is not None:
                    load[index] += 1
        return load

    def gpus_in_use(self) -> int:
        return len(self._gpu_load())

    def create(self, body: Any) -> dict[str, Any]:
        body = bodies.json_object(body, "create-job")
        job_id = body.get("job_id") or f"job-{uuid.uuid4().hex[:12]}"
        bodies.job_id(job_id)
        idle_timeout = idle.hosted_idle_timeout(body) if self.hosted else 0
        specs = parse_sub_jobs(job_id, body.get("sub_job_configs"))
        for i, spec in enumerate(specs):
            if self.hosted and hosted.is_model_folder(spec.model_name):
                raise hosted.refuse(
                    "no-model-folders",
                    f"sub_job_configs[{i}].model_name={abridge(spec.model_name)} is a folder on "
                    "this machine; hosted Cortex loads models by name",
                )
            if spec.model_name not in FIXTURE_MODELS:
                try:
                    resolve_model_path(spec.model_name)
                except (ModelNotAvailableError, OSError, ValueError) as exc:
                    raise BackendError(f"sub_job_configs[{i}].model_name: {exc}") from exc
            if spec.source_checkpoint:
                self.checkpoints.directory(
                    spec.source_checkpoint["source_job_id"], spec.source_checkpoint["checkpoint_id"]
                )
        with self._lock:
            if job_id in self.jobs:
                raise Conflict(f"job_id={job_id!r} already exists")
            placement = devices.plan_placement(
                [devices.PlacementRequest(s.sub_job_id, s.job_type, s.n_gpus) for s in specs],
                self.device_mode,
                self.cuda_count,
                self._gpu_load(),
            )
            job = Job(
                job_id=job_id,
                specs=specs,
                created_at=time.time(),
                devices=placement,
                requests=RequestStore(
                    job_id, result_chunk_bytes=self.result_chunk_bytes, poll_wait_s=self.poll_wait_s
                ),
                idle_timeout_s=idle_timeout,
            )
            self.jobs[job_id] = job
        run_dir = self.job_dir(job_id) / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        # Without a fixed --threads, CPU workers share the cores among the busy ones (cores.py).
        threads = self.threads or self.cores.cores
        worker_specs = [
            self._worker_spec(job, spec, placement[spec.sub_job_id], threads) for spec in specs
        ]
        if self.hosted:  # placing and initializing happen after the answer, as hosted does
            self._pool.submit(self._start_hosted, job, worker_specs, run_dir)
            return {"job_id": job_id}
        self._assign(job, worker_specs, run_dir)
        self._pool.submit(self._watch_start, job)
        return {"job_id": job_id}

    def _worker_spec(self, job: Job, spec: SubJobSpec, device: str, threads: int) -> WorkerSpec:
        return WorkerSpec(
            job_id=job.job_id,
            sub_job_id=spec.sub_job_id,
            job_type=spec.job_type,
            model_name=spec.model_name,
            dtype=devices.resolve_dtype(spec.dtype, device),
            device=device,
            seed=spec.seed,
            max_seq_len=spec.max_seq_len,
            threads=threads,
            lora=spec.lora.as_dict() if spec.lora else None,
            optimizer=spec.optimizer.__dict__ if spec.optimizer else None,
            gradient_clipping=spec.gradient_clipping,
            load_optimizer_states=spec.load_optimizer_states,
            max_num_seqs=spec.max_num_seqs if spec.job_type == "sampling" else 0,
            max_num_batched_tokens=(
                spec.max_num_batched_tokens if spec.job_type == "sampling" else 0
            ),
            source_checkpoint_dir=(
                str(
                    self.checkpoints.directory(
                        spec.source_checkpoint["source_job_id"],
                        spec.source_checkpoint["checkpoint_id"],
                    )
                )
                if spec.source_checkpoint
                else None
            ),
        )

    def _assign(self, job: Job, worker_specs: list[WorkerSpec], run_dir: Path) -> None:
        """Start (or take a spare for) each sub-job's worker; one that starts after the job
        ended (a cancel while placing) is stopped at once."""
        for worker_spec in worker_specs:
            if job.finished or self._stopped.is_set():
                return
            device = worker_spec.device
            handle = WorkerHandle(
                worker_spec,
                run_dir,
                run_dir / f"{worker_spec.sub_job_id.replace(':', '_')}.log",
                on_death=lambda handle, reason, job=job: self._worker_died(job, handle, reason),
                cores=self.cores if device == devices.CPU and not self.threads else None,
                spares=self.spares,
            )
            with job.lock:
                job.workers[worker_spec.sub_job_id] = handle
                ended = job.finished or self._stopped.is_set()
            if ended:
                handle.close()
                return

    def _advance(self, job: Job, before: str, after: str) -> bool:
        """``before -> after`` unless the job has left ``before`` (failed, cancelled); in hosted
        mode once ``before`` has lasted :data:`HOSTED_STATE_MIN_S`."""
        if self.hosted:
            wait = job.status_since + HOSTED_STATE_MIN_S - time.monotonic()
            if wait > 0:
                self._stopped.wait(wait)
        with job.lock:
            if job.status != before:
                return False
            job.status, job.status_since = after, time.monotonic()
            job.last_request = job.status_since
        if self.hosted:
            log.info("job %s is %s", job.job_id, after)
        return True

    def _start_hosted(self, job: Job, worker_specs: list[WorkerSpec], run_dir: Path) -> None:
        """Rule ``hosted-job-states``: pending -> placing -> initializing -> running."""
        if not self._advance(job, "pending", "placing"):
            return
        try:
            self._assign(job, worker_specs, run_dir)
        except Exception as exc:  # a worker process that cannot be started fails the job
            log.exception("job %s: starting its workers failed", job.job_id)
            self._fail(job, f"starting its workers failed: {type(exc).__name__}: {exc}")
            return
        if self._advance(job, "placing", "initializing"):
            self._watch_start(job)

    def _watch_start(self, job: Job) -> None:
        for handle in list(job.workers.values()):
            handle.ready.wait()
            if handle.error:
                self._fail(job, f"{handle.sub_job_id}: {handle.error}")
                return
        self._advance(job, "initializing" if self.hosted else "pending", "running")

    def touch(self, job_id: str) -> None:
        """A request on ``job_id``'s paths arrived or was answered (its idle clock restarts)."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.last_request = time.monotonic()

    def _watch_idle(self) -> None:
        """Rule ``idle-timeout``: end the running jobs idle for their ``idle_timeout_seconds``
        (a job with an unfinished request is not idle)."""
        while not self._stopped.wait(idle.IDLE_CHECK_S):
            now = time.monotonic()
            for job in list(self.jobs.values()):
                if job.status != "running" or not job.idle_timeout_s:
                    continue
                if job.requests.unfinished():
                    job.last_request = now
                elif (now - job.last_request) * self.idle_clock_scale >= job.idle_timeout_s:
                    self._terminate(job)

    def _terminate(self, job: Job) -> None:
        seconds = job.idle_timeout_s
        reason = (
            f"idle for {seconds} s: no request for idle_timeout_seconds={seconds} (create the "
            "job with a larger idle_timeout_seconds, or 0 to never end it for idleness)"
        )
        with job.lock:
            if job.status != "running":
                return
            job.status, job.reason = "terminated", hosted.refuse("idle-timeout", reason).message
            job.status_since = time.monotonic()
        log.warning("job %s terminated: %s", job.job_id, job.reason)
        job.requests.fail_unfinished(f"the job was terminated: {job.reason}", cancelled=False)
        self._stop_workers(job)

    def _worker_died(self, job: Job, handle: WorkerHandle, reason: str) -> None:
        self._pool.submit(self._fail, job, f"{handle.sub_job_id}: {reason}")

    def _fail(self, job: Job, reason: str) -> None:
        with job.lock:
            if job.finished:
                return
            job.status, job.reason = "failed", reason
        log.error("job %s failed: %s", job.job_id, reason)
        job.requests.fail_unfinished(reason, cancelled=False)
        self._stop_workers(job)

    # -- read ----------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        job = self.jobs.get(job_id) if isinstance(job_id, str) else None
        if job is None:
            raise NotFound(f"job {abridge(job_id)} not found")
        return job

    def require_running(self, job_id: str) -> Job:
        """The job, if it accepts data-plane requests; else a 409 that says why not."""
        job = self.get(job_id)
        if job.status != "running":
            starting = job.status in STARTING
            raise BackendError(
                f"job {job_id} is {job.status}{': ' + job.reason if job.reason else ''}; "
                "data-plane calls need a running job"
                + (" (wait_for_job first)" if starting else ""),
                # 409 (the SDK retries it) while it starts; 410 once it can never run again.
                status=409 if starting else 410,
                code=f"job_{job.status}",
            )
        return job

    def describe(self, job: Job) -> dict[str, Any]:
        sub_jobs = []
        for spec in job.specs:
            handle = job.workers.get(spec.sub_job_id)
            info = handle.info if handle else None
            dead = handle is not None and handle.error is not None
            device = job.devices[spec.sub_job_id]
            sub_jobs.append(
                {
                    **spec.to_wire(),
                    "status": "failed" if dead else job.status,
                    **({"reason": handle.error} if dead else {}),
                    "device": device,
                    "dtype": devices.resolve_dtype(spec.dtype, device),
                    **({"info": info} if info else {}),
                }
            )
        return {
            "job_id": job.job_id,
            "status": job.status,
            "reason": job.reason,
            "created_at": job.created_at,
            "updated_at": time.time(),
            "sub_jobs": sub_jobs,
        }

    def list(self, status: str | None = None) -> list[dict[str, Any]]:
        jobs = [self.describe(j) for j in list(self.jobs.values())]
        if status:
            jobs = [j for j in jobs if j["status"] == status.lower()]
        return jobs

    # -- stop ----------------------------------------------------------------------------------

    def cancel(self, job_id: str) -> Job:
        job = self.get(job_id)
        with job.lock:
            if not job.finished:
                job.status, job.reason = "cancelled", "cancelled by request"
        job.requests.fail_unfinished("cancelled: the job was cancelled", cancelled=True)
        self._stop_workers(job)
        return job

    @staticmethod
    def _stop_workers(job: Job) -> None:
        with job.lock:
            handles = list(job.workers.values())
        for handle in handles:
            handle.close()

    def shutdown(self) -> None:
        self._stopped.set()
        self.spares.close()
        for job in list(self.jobs.values()):
            self._stop_workers(job)
        self._pool.shutdown(wait=False, cancel_futures=True)
