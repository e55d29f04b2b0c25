"""Jobs, sub-jobs, asynchronous requests and request-chunk groups of the local backend."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from cortex_training import wire

from cortex_recipes.local import processors
from cortex_recipes.local.checkpoints import META, read_meta
from cortex_recipes.local.errors import BackendError, Conflict, NotFound
from cortex_recipes.local.sampling import parse_sampling_params
from cortex_recipes.local.specs import (
    CHECKPOINT_ID_RE,
    JOB_ID_RE,
    JOB_TYPES,
    SubJobSpec,
    parse_sub_jobs,
)
from cortex_recipes.local.workers import WorkerHandle, WorkerReply
from cortex_recipes.models import FIXTURE_MODELS, ModelNotAvailableError, resolve_model_path

log = logging.getLogger(__name__)

KWARG_KEYS = {"input_ids", "attention_mask", "position_ids", "labels"}
WEIGHT_FORMATS = ("vllm", "hf", "lora")
MAX_REQUESTS_KEPT = 512


@dataclass
class Request:
    request_id: str
    job_id: str
    sub_job_id: str
    operation: str
    status: str = "pending"
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    started_at: float | None = None
    result: bytes | None = None
    error: str | None = None
    future: Future | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def finish(self, *, result: bytes | None = None, error: str | None = None) -> None:
        now = time.time()
        self.result, self.error = result, error
        self.status = "failed" if error is not None else "completed"
        self.updated_at = now
        self.done.set()

    def cancel(self, reason: str) -> None:
        self.status, self.error = "cancelled", reason
        self.updated_at = time.time()
        self.done.set()


@dataclass
class ChunkGroup:
    frame_sha256: str
    total: int
    frame_size: int
    chunks: dict[int, bytes] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)
    request_id: str | None = None


@dataclass
class Job:
    job_id: str
    specs: list[SubJobSpec]
    created_at: float
    workers: dict[str, WorkerHandle] = field(default_factory=dict)
    status: str = "pending"
    reason: str = ""
    requests: OrderedDict[str, Request] = field(default_factory=OrderedDict)
    chunk_groups: dict[str, ChunkGroup] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    weight_version: int = 0

    def sub_job(self, sub_job_id: str) -> SubJobSpec:
        for spec in self.specs:
            if spec.sub_job_id == sub_job_id:
                return spec
        raise BackendError(
            f"sub_job_id={sub_job_id!r} is not part of job {self.job_id}; sub-jobs: "
            f"{', '.join(s.sub_job_id for s in self.specs)}"
        )

    def of_type(self, job_type: str) -> list[SubJobSpec]:
        return [s for s in self.specs if s.job_type == job_type]


def _decode_frame(data: bytes, where: str) -> Any:
    try:
        return wire.loads(data)
    except wire.WireError as exc:
        raise BackendError(f"{where}: {exc}") from exc
    except Exception as exc:  # malformed JSON inside a header, bad dtypes, ...
        raise BackendError(
            f"{where}: not a valid DSSST1 frame ({type(exc).__name__}: {exc})"
        ) from exc


class JobManager:
    """Owns every job of one server process."""

    def __init__(
        self,
        state_dir: Path,
        *,
        result_chunk_bytes: int = 8 * 1024 * 1024,
        threads: int | None = None,
        poll_wait_s: float = 0.25,
    ):
        # A status poll of an unfinished request waits up to poll_wait_s for it to finish, so a
        # client polling in a tight loop neither adds latency nor steals CPU from the workers.
        self.poll_wait_s = poll_wait_s
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.result_chunk_bytes = result_chunk_bytes
        self.threads = threads
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="orchestrate")

    # -- jobs ------------------------------------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        return self.state_dir / "jobs" / job_id

    def create_job(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BackendError("create-job body must be a JSON object")
        job_id = body.get("job_id") or f"job-{uuid.uuid4().hex[:12]}"
        if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
            raise BackendError(f"job_id={job_id!r} must match {JOB_ID_RE.pattern}")
        specs = parse_sub_jobs(job_id, body.get("sub_job_configs"))
        for spec in specs:
            if spec.model_name not in FIXTURE_MODELS:
                try:
                    resolve_model_path(spec.model_name)
                except ModelNotAvailableError as exc:
                    raise BackendError(str(exc)) from exc
            if spec.source_checkpoint:
                self.checkpoint_dir(
                    spec.source_checkpoint["source_job_id"], spec.source_checkpoint["checkpoint_id"]
                )
        with self._lock:
            if job_id in self.jobs:
                raise Conflict(f"job_id={job_id!r} already exists")
            job = Job(job_id=job_id, specs=specs, created_at=time.time())
            self.jobs[job_id] = job
        run_dir = self.job_dir(job_id) / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        threads = self.threads or max(1, (os.cpu_count() or 1) // len(specs))
        for spec in specs:
            worker_spec = {
                "job_id": job_id,
                "sub_job_id": spec.sub_job_id,
                "job_type": spec.job_type,
                "model_name": spec.model_name,
                "dtype": spec.dtype,
                "seed": spec.seed,
                "max_seq_len": spec.max_seq_len,
                "threads": threads,
                "lora": spec.lora.as_dict() if spec.lora else None,
                "optimizer": spec.optimizer.__dict__ if spec.optimizer else None,
                "gradient_clipping": spec.gradient_clipping,
                "load_optimizer_states": spec.load_optimizer_states,
                "source_checkpoint_dir": (
                    str(
                        self.checkpoint_dir(
                            spec.source_checkpoint["source_job_id"],
                            spec.source_checkpoint["checkpoint_id"],
                        )
                    )
                    if spec.source_checkpoint
                    else None
                ),
            }
            job.workers[spec.sub_job_id] = WorkerHandle(
                worker_spec, run_dir, run_dir / f"{spec.sub_job_id.replace(':', '_')}.log"
            )
        self._pool.submit(self._watch_start, job)
        return {"job_id": job_id}

    def _watch_start(self, job: Job) -> None:
        for handle in job.workers.values():
            handle.ready.wait()
            if handle.error:
                job.status, job.reason = "failed", f"{handle.sub_job_id}: {handle.error}"
                log.error("job %s failed to start: %s", job.job_id, job.reason)
                self._stop_workers(job)
                return
        if job.status == "pending":
            job.status = "running"

    def get(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound(f"job {job_id!r} not found")
        return job

    def running(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job.status != "running":
            raise BackendError(
                f"job {job_id} is {job.status}{': ' + job.reason if job.reason else ''}; "
                "data-plane calls need a running job (wait_for_job first)",
                status=409 if job.status == "pending" else 400,
            )
        return job

    def describe(self, job: Job) -> dict[str, Any]:
        return {
            "job_id": job.job_id,
            "status": job.status,
            "reason": job.reason,
            "created_at": job.created_at,
            "updated_at": time.time(),
            "sub_jobs": [
                {
                    **spec.to_wire(),
                    "status": job.status,
                    **(
                        {"info": job.workers[spec.sub_job_id].info}
                        if job.workers[spec.sub_job_id].info
                        else {}
                    ),
                }
                for spec in job.specs
            ],
        }

    def cancel(self, job_id: str) -> None:
        job = self.get(job_id)
        if job.status in ("pending", "running"):
            job.status, job.reason = "cancelled", "cancelled by request"
        self._stop_workers(job)

    def _stop_workers(self, job: Job) -> None:
        for handle in job.workers.values():
            handle.close()

    def shutdown(self) -> None:
        for job in list(self.jobs.values()):
            self._stop_workers(job)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- requests ----------------------------------------------------------------------------------

    def _new_request(self, job: Job, sub_job_id: str, operation: str) -> Request:
        request = Request(
            request_id=f"req-{uuid.uuid4().hex}",
            job_id=job.job_id,
            sub_job_id=sub_job_id,
            operation=operation,
        )
        with job.lock:
            job.requests[request.request_id] = request
            while len(job.requests) > MAX_REQUESTS_KEPT:
                job.requests.popitem(last=False)
        return request

    def _run_on_worker(
        self, job: Job, sub_job_id: str, operation: str, header: dict, body: bytes = b""
    ) -> Request:
        request = self._new_request(job, sub_job_id, operation)
        future = job.workers[sub_job_id].submit({**header, "id": request.request_id}, body)
        request.future = future
        future.add_done_callback(lambda f: self._complete(request, f))
        return request

    @staticmethod
    def _complete(request: Request, future: Future) -> None:
        if future.cancelled():
            request.cancel("cancelled before it started")
            return
        exc = future.exception()
        if exc is not None:
            request.finish(error=str(exc))
            return
        reply: WorkerReply = future.result()
        request.started_at = reply.started_at
        if reply.ok:
            request.finish(result=reply.body)
        else:
            request.finish(error=reply.error or "failed")

    def _orchestrate(self, job: Job, sub_job_id: str, operation: str, fn) -> Request:
        request = self._new_request(job, sub_job_id, operation)

        def run() -> None:
            request.status, request.started_at = "running", time.time()
            try:
                request.finish(result=wire.dumps(fn()))
            except BackendError as exc:
                request.finish(error=exc.message)
            except Exception as exc:
                log.exception("%s failed", operation)
                request.finish(error=f"{type(exc).__name__}: {exc}")

        self._pool.submit(run)
        return request

    def request_status(
        self, job_id: str, request_id: str, cursor: str | None, max_events: int | None
    ) -> dict[str, Any]:
        job = self.get(job_id)
        request = job.requests.get(request_id)
        if request is None:
            raise NotFound(f"request {request_id!r} not found in job {job_id}")
        if not cursor:
            request.done.wait(self.poll_wait_s)
        status = request.status
        if status == "pending" and request.future is not None and request.future.running():
            status = "running"
        body: dict[str, Any] = {
            "request_id": request.request_id,
            "job_id": job_id,
            "sub_job_id": request.sub_job_id,
            "operation": request.operation,
            "status": status,
            "created_at": request.created_at,
            "updated_at": request.updated_at,
            "started_at": request.started_at,
            "error": request.error,
            "result": None,
            "events": [],
            "next_cursor": "",
        }
        if status != "completed" or request.result is None:
            return body
        frame = request.result
        if len(frame) <= self.result_chunk_bytes:
            body["result"] = {
                "wire_format": wire.WIRE_FORMAT_VERSION,
                "encoding": "base64",
                "payload_b64": base64.b64encode(frame).decode("ascii"),
                "content_type": "application/octet-stream",
            }
            return body
        chunks = wire.encode_byte_chunks(frame, kind="result", max_bytes=self.result_chunk_bytes)
        try:
            start = int(cursor) if cursor else 0
        except ValueError as exc:
            raise BackendError(f"cursor={cursor!r} is not a cursor this server issued") from exc
        if not 0 <= start <= len(chunks):
            raise BackendError(f"cursor={cursor!r} is out of range")
        limit = max(1, min(int(max_events or 16), 512))
        page = chunks[start : start + limit]
        body["events"] = [
            {
                "type": "result_chunk",
                "payload_b64": base64.b64encode(chunk).decode("ascii"),
                "payload_sha256": hashlib.sha256(chunk).hexdigest(),
            }
            for chunk in page
        ]
        end = start + len(page)
        body["next_cursor"] = str(end) if end < len(chunks) else ""
        return body

    def cancel_request(self, job: Job, request_id: str) -> dict[str, Any]:
        request = job.requests.get(request_id)
        if request is None:
            raise NotFound(f"request {request_id!r} not found in job {job.job_id}")
        cancelled = bool(request.future and request.future.cancel())
        if cancelled:
            request.cancel("cancelled by request")
        return {"request_id": request_id, "cancelled": cancelled, "status": request.status}

    # -- routing -----------------------------------------------------------------------------------

    def training_sub_job(self, job: Job, operation: str) -> str:
        training = job.of_type("training")
        if not training:
            raise BackendError(f"{operation} needs a training sub-job; job {job.job_id} has none")
        return training[0].sub_job_id

    def route(
        self,
        job: Job,
        operation: str,
        sub_job_id: str | None,
        sub_job_type: str | None,
        allowed: tuple[str, ...],
        default: tuple[str, ...],
    ) -> SubJobSpec:
        if sub_job_id is not None:
            spec = job.sub_job(sub_job_id)
            if sub_job_type is not None and spec.job_type != sub_job_type:
                raise BackendError(
                    f"sub_job_id={sub_job_id!r} is a {spec.job_type} sub-job, not sub_job_type={sub_job_type!r}"
                )
        elif sub_job_type is not None:
            matches = job.of_type(sub_job_type)
            if not matches:
                raise BackendError(f"job {job.job_id} has no {sub_job_type!r} sub-job")
            spec = matches[0]
        else:
            spec = next((s for t in default for s in job.of_type(t)), None)
            if spec is None:
                raise BackendError(
                    f"{operation} needs a sub-job of type {' or '.join(allowed)}; job {job.job_id} has none"
                )
        if spec.job_type not in allowed:
            raise BackendError(
                f"operation {operation!r} cannot run on {spec.job_type} sub-job {spec.sub_job_id}; "
                f"it runs on {' or '.join(allowed)} sub-jobs"
            )
        return spec

    # -- frame validation --------------------------------------------------------------------------

    def _validate_model_frame(
        self, job: Job, spec: SubJobSpec, frame: Any, *, training: bool
    ) -> None:
        if not isinstance(frame, dict) or not isinstance(frame.get("kwargs"), dict):
            raise BackendError("frame must be an object with a kwargs object")
        unknown_top = set(frame) - {
            "args",
            "kwargs",
            "context",
            "processing",
            "rr_sample_ids",
            "rr_discard",
        }
        if unknown_top:
            raise BackendError(f"frame has unknown keys {sorted(unknown_top)}")
        if frame.get("args") not in (None, (), []):
            raise BackendError("frame.args must be empty; pass tensors as kwargs")
        kwargs = frame["kwargs"]
        unknown = set(kwargs) - KWARG_KEYS
        if unknown:
            raise BackendError(
                f"kwargs has unknown keys {sorted(unknown)}; accepted: {', '.join(sorted(KWARG_KEYS))}"
            )
        ids = kwargs.get("input_ids")
        if (
            not torch.is_tensor(ids)
            or ids.dim() != 2
            or ids.is_floating_point()
            or ids.dtype == torch.bool
        ):
            raise BackendError(
                "kwargs.input_ids must be an integer tensor of shape [batch, seq_len]"
            )
        if ids.numel() == 0:
            raise BackendError("kwargs.input_ids is empty")
        if ids.shape[1] > spec.max_seq_len:
            raise BackendError(
                f"kwargs.input_ids has seq_len {ids.shape[1]}, above the sub-job's max_seq_len {spec.max_seq_len}"
            )
        vocab = (job.workers[spec.sub_job_id].info or {}).get("vocab_size")
        if vocab and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise BackendError(f"kwargs.input_ids has ids outside [0, {vocab})")
        for key in ("attention_mask", "position_ids", "labels"):
            value = kwargs.get(key)
            if value is None:
                continue
            if not torch.is_tensor(value) or tuple(value.shape) != tuple(ids.shape):
                raise BackendError(f"kwargs.{key} must be a tensor of shape {list(ids.shape)}")
        processing = processors.parse_processing(frame.get("processing"), require_loss=False)
        if not training and processing.loss_fn is not None:
            raise BackendError("forward runs no loss; remove processing.loss_fn")
        processors.validate_context(processing, frame.get("context"), ids)

    # -- data plane ----------------------------------------------------------------------------------

    def receive_forward_backward(self, job_id: str, data: bytes) -> dict[str, Any]:
        job = self.running(job_id)
        sub_job_id = self.training_sub_job(job, "forward-backward")
        desc = wire.read_byte_chunk_metadata(data)
        if desc is None:
            frame_bytes = data
            return self._submit_forward_backward(job, sub_job_id, frame_bytes)
        if desc["kind"] != "request":
            raise BackendError("forward-backward accepts request chunks, got a result chunk")
        group_id = str(desc.get("chunk_group_id") or "")
        try:
            idx, total = int(desc["chunk_idx"]), int(desc["total_chunks"])
            sha, size = str(desc["frame_sha256"]), int(desc["frame_size_bytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendError(f"request_chunk metadata is incomplete: {exc}") from exc
        if not group_id or total <= 0 or not 0 <= idx < total:
            raise BackendError(
                f"request_chunk has chunk_idx={idx}, total_chunks={total}, chunk_group_id={group_id!r}"
            )
        payload = _decode_frame(data, "request chunk")
        if not isinstance(payload, dict) or not torch.is_tensor(payload.get("payload")):
            raise BackendError("request chunk has no payload tensor")
        chunk_bytes = payload["payload"].numpy().tobytes()
        with job.lock:
            group = job.chunk_groups.get(group_id)
            if group is None:
                if idx != 0:
                    raise Conflict(
                        "request chunk group is unknown; replay from chunk 0",
                        code="chunk_group_restart_required",
                    )
                group = ChunkGroup(frame_sha256=sha, total=total, frame_size=size)
                job.chunk_groups[group_id] = group
            if (group.frame_sha256, group.total, group.frame_size) != (sha, total, size):
                raise Conflict(
                    f"chunk_group_id {group_id} was already used for a different frame",
                    code="chunk_group_conflict",
                )
            if idx in group.chunks and group.chunks[idx] != chunk_bytes:
                raise Conflict(
                    f"chunk {idx} of group {group_id} was sent with different bytes",
                    code="chunk_group_conflict",
                )
            group.chunks[idx] = chunk_bytes
            if (
                group.request_id is not None
            ):  # a replay of a group that already ran: never run twice
                if idx == total - 1:
                    return {"request_id": group.request_id, "job_id": job_id, "replayed": True}
                return {
                    "job_id": job_id,
                    "chunk_group_id": group_id,
                    "received": len(group.digests),
                }
            group.chunks[idx] = chunk_bytes
            if len(group.chunks) < total:
                if idx == total - 1:
                    missing = sorted(set(range(total)) - set(group.chunks))
                    raise Conflict(
                        f"request chunk group is missing chunks {missing[:10]}",
                        code="chunk_group_missing_chunks",
                    )
                return {"job_id": job_id, "chunk_group_id": group_id, "received": len(group.chunks)}
            frame_bytes = b"".join(group.chunks[i] for i in range(total))
            if len(frame_bytes) != size or hashlib.sha256(frame_bytes).hexdigest() != sha:
                del job.chunk_groups[group_id]
                raise BackendError("reassembled forward-backward frame does not match frame_sha256")
            response = self._submit_forward_backward(job, sub_job_id, frame_bytes)
            group.request_id = response["request_id"]
            group.chunks = (
                {i: b"" if i < total - 1 else chunk_bytes for i in group.chunks}
                if False
                else group.chunks
            )
            return response

    def _submit_forward_backward(
        self, job: Job, sub_job_id: str, frame_bytes: bytes
    ) -> dict[str, Any]:
        frame = _decode_frame(frame_bytes, "forward-backward frame")
        self._validate_model_frame(job, job.sub_job(sub_job_id), frame, training=True)
        request = self._run_on_worker(
            job, sub_job_id, "forward_backward", {"op": "forward_backward"}, frame_bytes
        )
        return {"request_id": request.request_id, "job_id": job.job_id}

    def step(self, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
        job = self.running(job_id)
        unknown = set(body) - {"learning_rate"}
        if unknown:
            raise BackendError(
                f"step body has unknown keys {sorted(unknown)}; accepted: learning_rate"
            )
        lr = body.get("learning_rate")
        if lr is not None and (
            isinstance(lr, bool)
            or not isinstance(lr, int | float)
            or not lr >= 0
            or lr == float("inf")
        ):
            raise BackendError(f"learning_rate={lr!r} must be a finite number >= 0")
        sub_job_id = self.training_sub_job(job, "step")
        request = self._run_on_worker(job, sub_job_id, "step", {"op": "step", "learning_rate": lr})
        return {"request_id": request.request_id, "job_id": job_id}

    # -- checkpoints ------------------------------------------------------------------------------------

    def checkpoint_dir(self, job_id: str, checkpoint_id: str) -> Path:
        if not isinstance(checkpoint_id, str) or not CHECKPOINT_ID_RE.match(checkpoint_id):
            raise BackendError(
                f"checkpoint_id={checkpoint_id!r} is not a checkpoint id (cp_<32 hex>)"
            )
        if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
            raise BackendError(f"source_job_id={job_id!r} is not a job id")
        root = self.job_dir(job_id) / "checkpoints" / checkpoint_id
        steps = sorted(root.glob(f"global_step*/{META}"))
        if not steps:
            raise NotFound(f"checkpoint {checkpoint_id} not found in job {job_id}")
        return steps[-1].parent

    def save(self, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
        job = self.running(job_id)
        unknown = set(body) - {"checkpoint_id", "checkpoint_type"}
        if unknown:
            raise BackendError(f"save body has unknown keys {sorted(unknown)}")
        checkpoint_type = str(body.get("checkpoint_type") or "resumable").lower()
        if checkpoint_type not in ("resumable", "weights-only"):
            raise BackendError(
                f"checkpoint_type={checkpoint_type!r}; accepted: resumable, weights-only"
            )
        sub_job_id = self.training_sub_job(job, "save")
        checkpoint_id = f"cp_{uuid.uuid4().hex}"
        handle = job.workers[sub_job_id]

        def run() -> dict[str, Any]:
            staging = self.job_dir(job_id) / "checkpoints" / checkpoint_id / "staging"
            staging.parent.mkdir(parents=True, exist_ok=True)
            reply = handle.submit(
                {
                    "op": "save",
                    "directory": str(staging),
                    "checkpoint_type": checkpoint_type,
                    "checkpoint_id": checkpoint_id,
                }
            ).result()
            if not reply.ok:
                shutil.rmtree(staging.parent, ignore_errors=True)
                raise BackendError(reply.error or "save failed")
            steps = int(wire.loads(reply.body)["global_steps"])
            final = staging.parent / f"global_step{steps}"
            os.replace(staging, final)
            return {
                "job_id": job_id,
                "checkpoint_id": checkpoint_id,
                "checkpoint_type": checkpoint_type,
                "global_steps": steps,
                "stage_path": f"{final.as_posix()}/",
                "checkpoint_path": f"{final.as_posix()}/",
            }

        request = self._orchestrate(job, sub_job_id, "save", run)
        return {"request_id": request.request_id, "job_id": job_id}

    def load(self, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
        job = self.running(job_id)
        unknown = set(body) - {"checkpoint_id", "source_job_id", "target_sub_job_id"}
        if unknown:
            raise BackendError(f"load body has unknown keys {sorted(unknown)}")
        target = body.get("target_sub_job_id")
        if target is not None:
            spec = job.sub_job(target)
            if spec.job_type != "training":
                raise BackendError(
                    f"load into {spec.job_type} sub-job {target} is not implemented; load targets the training sub-job",
                    status=501,
                )
        sub_job_id = self.training_sub_job(job, "load")
        directory = self.checkpoint_dir(
            body.get("source_job_id") or job_id, body.get("checkpoint_id")
        )
        request = self._run_on_worker(
            job, sub_job_id, "load", {"op": "load", "directory": str(directory)}
        )
        return {"request_id": request.request_id, "job_id": job_id}

    def list_checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        self.get(job_id)
        out = []
        for meta_path in sorted(
            (self.job_dir(job_id) / "checkpoints").glob(f"cp_*/global_step*/{META}")
        ):
            meta = read_meta(meta_path.parent)
            out.append(
                {
                    "checkpoint_id": meta["checkpoint_id"],
                    "checkpoint_type": meta["checkpoint_type"],
                    "global_steps": meta["global_steps"],
                    "created_at": meta["created_at"],
                    "stage_path": f"{meta_path.parent.as_posix()}/",
                }
            )
        return sorted(out, key=lambda c: c["created_at"])

    def delete_checkpoint(self, job_id: str, checkpoint_id: str) -> None:
        self.get(job_id)
        directory = self.checkpoint_dir(job_id, checkpoint_id)
        shutil.rmtree(directory.parent)

    # -- generate and operations ---------------------------------------------------------------------

    def generate(self, job_id: str, data: bytes) -> dict[str, Any]:
        job = self.running(job_id)
        desc = wire.read_byte_chunk_metadata(data)
        if desc is not None:
            raise BackendError(
                "chunked generate requests are not supported by the local backend; send under 60 MiB"
            )
        frame = _decode_frame(data, "generate frame")
        if not isinstance(frame, dict) or "prompts" not in frame:
            raise BackendError("generate frame must be an object with prompts")
        unknown = set(frame) - {"prompts", "sampling_params", "routing_key", "strict"}
        if unknown:
            raise BackendError(f"generate frame has unknown keys {sorted(unknown)}")
        prompts = frame["prompts"]
        if not isinstance(prompts, list) or not prompts:
            raise BackendError("prompts must be a non-empty list of strings or token-id lists")
        samplers = job.of_type("sampling")
        if not samplers:
            raise BackendError(f"generate needs a sampling sub-job; job {job_id} has none")
        spec = samplers[0]
        if len(samplers) > 1 and isinstance(frame.get("routing_key"), str):
            spec = samplers[
                int(hashlib.sha256(frame["routing_key"].encode()).hexdigest(), 16) % len(samplers)
            ]
        vocab = (job.workers[spec.sub_job_id].info or {}).get("vocab_size")
        params = frame.get("sampling_params")
        if isinstance(params, list) and len(params) != len(prompts):
            raise BackendError(
                f"sampling_params has {len(params)} entries for {len(prompts)} prompts"
            )
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                continue
            if (
                not isinstance(prompt, list)
                or not prompt
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            ):
                raise BackendError(
                    f"prompts[{i}] must be a string or a non-empty list of token ids"
                )
            if vocab and (min(prompt) < 0 or max(prompt) >= vocab):
                raise BackendError(f"prompts[{i}] has token ids outside [0, {vocab})")
            if len(prompt) >= spec.max_seq_len:
                raise BackendError(
                    f"prompts[{i}] has {len(prompt)} tokens; must be shorter than max_seq_len {spec.max_seq_len}"
                )
            raw = params[i] if isinstance(params, list) else params
            parse_sampling_params(raw)
        request = self._run_on_worker(job, spec.sub_job_id, "generate", {"op": "generate"}, data)
        return {"request_id": request.request_id, "job_id": job_id}

    def operation(self, job_id: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BackendError("operation body must be a JSON object")
        op = body.get("operation_type")
        sub_job_id, sub_job_type = body.get("sub_job_id"), body.get("sub_job_type")
        payload = body.get("payload")
        if op == "tail-logs":
            return self._tail_logs(self.get(job_id), sub_job_id, sub_job_type, payload or {})
        job = self.running(job_id)
        if op == "forward":
            spec = self.route(
                job,
                op,
                sub_job_id,
                sub_job_type,
                ("log_probability", "training"),
                ("log_probability", "training"),
            )
            frame_bytes = self._operation_bytes(payload)
            frame = _decode_frame(frame_bytes, "forward frame")
            self._validate_model_frame(job, spec, frame, training=False)
            request = self._run_on_worker(
                job, spec.sub_job_id, "forward", {"op": "forward"}, frame_bytes
            )
            return {"request_id": request.request_id, "job_id": job_id}
        if op == "weight-sync":
            return self._weight_sync(job, sub_job_id, sub_job_type, payload)
        if op == "reset-prefix-cache":
            spec = self.route(job, op, sub_job_id, sub_job_type, ("sampling",), ("sampling",))
            return {
                "job_id": job_id,
                "sub_job_id": spec.sub_job_id,
                "reset": True,
                "note": "the local backend keeps no prefix cache",
            }
        if op == "cancel-request":
            if not isinstance(payload, dict) or not isinstance(payload.get("request_id"), str):
                raise BackendError("cancel-request needs payload.request_id")
            return self.cancel_request(job, payload["request_id"])
        accepted = "forward, weight-sync, reset-prefix-cache, cancel-request, tail-logs"
        raise BackendError(f"operation_type={op!r} is not supported; accepted: {accepted}")

    @staticmethod
    def _operation_bytes(payload: Any) -> bytes:
        if isinstance(payload, dict) and "payload_b64" in payload:
            try:
                return base64.b64decode(payload["payload_b64"], validate=True)
            except (ValueError, TypeError) as exc:
                raise BackendError(f"payload.payload_b64 is not valid base64: {exc}") from exc
        if isinstance(payload, dict):
            return wire.dumps(_json_frame_to_tensors(payload))
        raise BackendError("forward payload must be DSSST1 bytes (payload_b64) or a JSON object")

    def _weight_sync(
        self, job: Job, sub_job_id: str | None, sub_job_type: str | None, payload: Any
    ) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise BackendError("weight-sync needs a payload object")
        source = payload.get("source_sub_job_id")
        targets = payload.get("target_sub_job_ids")
        weight_format = payload.get("weight_format") or "vllm"
        if weight_format not in WEIGHT_FORMATS:
            raise BackendError(
                f"weight_format={weight_format!r}; accepted: {', '.join(WEIGHT_FORMATS)}"
            )
        if not isinstance(source, str):
            raise BackendError("weight-sync needs payload.source_sub_job_id")
        source_spec = self.route(
            job, "weight-sync", sub_job_id or source, sub_job_type, ("training",), ("training",)
        )
        if source_spec.sub_job_id != source:
            raise BackendError(
                f"weight-sync routed to {source_spec.sub_job_id} but source_sub_job_id is {source}"
            )
        if not isinstance(targets, list) or not targets:
            raise BackendError("weight-sync needs a non-empty payload.target_sub_job_ids list")
        target_specs = [job.sub_job(t) for t in targets]
        for spec in target_specs:
            if spec.job_type != "sampling":
                raise BackendError(
                    f"weight-sync target {spec.sub_job_id} is a {spec.job_type} sub-job; targets must be sampling sub-jobs"
                )
            if weight_format == "lora" and spec.lora is None:
                raise BackendError(
                    f"weight_format='lora' needs target {spec.sub_job_id} to be created with inference_config.peft_config"
                )
            if weight_format != "lora" and spec.lora is not None:
                raise BackendError(
                    f"target {spec.sub_job_id} serves a LoRA adapter; use weight_format='lora'"
                )
        with job.lock:
            job.weight_version += 1
            version = job.weight_version
        sync_dir = self.job_dir(job.job_id) / "weight-sync"
        sync_dir.mkdir(parents=True, exist_ok=True)
        path = sync_dir / f"v{version}.safetensors"

        def run() -> dict[str, Any]:
            try:
                reply = (
                    job.workers[source]
                    .submit(
                        {"op": "export_weights", "path": str(path), "weight_format": weight_format}
                    )
                    .result()
                )
                if not reply.ok:
                    raise BackendError(f"export from {source} failed: {reply.error}")
                exported = wire.loads(reply.body)
                futures = {
                    t.sub_job_id: job.workers[t.sub_job_id].submit(
                        {"op": "import_weights", "path": str(path), "weight_format": weight_format}
                    )
                    for t in target_specs
                }
                for target, future in futures.items():
                    result = future.result()
                    if not result.ok:
                        raise BackendError(f"import into {target} failed: {result.error}")
                return {
                    "job_id": job.job_id,
                    "source_sub_job_id": source,
                    "target_sub_job_ids": list(futures),
                    "weight_format": weight_format,
                    "weight_version": version,
                    "global_steps": exported["global_steps"],
                    "bytes": exported["bytes"],
                }
            finally:
                path.unlink(missing_ok=True)

        request = self._orchestrate(job, source, "weight_sync", run)
        return {"request_id": request.request_id, "job_id": job.job_id}

    def _tail_logs(
        self, job: Job, sub_job_id: str | None, sub_job_type: str | None, payload: dict
    ) -> dict[str, Any]:
        if sub_job_id is None and sub_job_type is None and len(job.specs) > 1:
            raise BackendError(
                "tail-logs needs sub_job_id or sub_job_type when a job has several sub-jobs"
            )
        spec = self.route(job, "tail-logs", sub_job_id, sub_job_type, JOB_TYPES, JOB_TYPES)
        cursor = payload.get("cursor") or "0"
        max_lines = payload.get("max_lines") or 200
        if (
            not re.fullmatch(r"\d+", str(cursor))
            or not isinstance(max_lines, int)
            or max_lines <= 0
        ):
            raise BackendError(f"tail-logs cursor={cursor!r} / max_lines={max_lines!r} are invalid")
        path = job.workers[spec.sub_job_id].log_path
        data = path.read_bytes() if path.exists() else b""
        start = min(int(cursor), len(data))
        lines = data[start:].splitlines(keepends=True)[:max_lines]
        end = start + sum(len(line) for line in lines)
        entries = [{"line": line.decode("utf-8", "replace").rstrip("\n")} for line in lines]
        return {"entries": entries, "next_cursor": str(end), "eof": end >= len(data)}


def _json_frame_to_tensors(payload: dict[str, Any]) -> dict[str, Any]:
    """A JSON forward payload (lists of ints) as the tensor frame the worker expects."""
    kwargs = payload.get("kwargs")
    if not isinstance(kwargs, dict):
        raise BackendError("forward payload needs a kwargs object")
    try:
        tensors = {k: torch.tensor(v, dtype=torch.long) for k, v in kwargs.items()}
    except (TypeError, ValueError) as exc:
        raise BackendError(f"forward payload kwargs must be integer lists: {exc}") from exc
    return {
        "args": (),
        "kwargs": tensors,
        **({"processing": payload["processing"]} if "processing" in payload else {}),
    }
