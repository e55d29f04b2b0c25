"""The data plane: forward-backward, step, save, load, checkpoints, generate, request polling.

Invariants:
- Every call is validated (:mod:`~cortex_recipes.local.bodies`, :mod:`~cortex_recipes.local.frame_checks`, :mod:`~cortex_recipes.local.generate_params`) against the running job and
  the routed sub-job before a worker sees it; the worker receives the normalised header.
- Chunked frames go through the job's :class:`~cortex_recipes.local.chunks.ChunkAssembler`, so
  a chunk group's gradient is applied at most once.
- In hosted-conformance mode (:mod:`~cortex_recipes.local.hosted`) each rule that shapes a
  request or its result is applied here, at the one place that handles the call.
- ``save`` uses the caller's ``checkpoint_id`` when one is given (pattern-checked, 409 if it is
  taken), else a new one (in hosted-conformance mode always a new one); a failed save leaves
  nothing listed.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import uuid
from typing import Any

from cortex_recipes.local import bodies, frame_checks, generate_params, hosted
from cortex_recipes.local.dispatch import Dispatcher, route, training_sub_job, worker_result
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.jobs import Job, JobRegistry
from cortex_recipes.local.specs import abridge

log = logging.getLogger(__name__)


class DataPlane:
    def __init__(self, registry: JobRegistry, dispatcher: Dispatcher, *, hosted: bool = False):
        self.registry = registry
        self.dispatcher = dispatcher
        self.hosted = hosted
        self._forwards = itertools.count()  # numbers forwards: rule forward-logprobs-placement

    def _result_shape(self, spec) -> dict[str, Any]:
        """Header keys that make a worker shape its result as hosted does (none by default)."""
        if not self.hosted:
            return {}
        return {"logprobs_at": hosted.logprobs_place(next(self._forwards)), "ranks": spec.n_gpus}

    # -- model frames --------------------------------------------------------------------------

    def forward_backward(self, job_id: str, data: bytes) -> dict[str, Any]:
        job = self.registry.require_running(job_id)
        sub_job_id = training_sub_job(job, "forward-backward")
        desc = bodies.request_chunk(data, "forward-backward")
        if desc is None:
            return self._submit_forward_backward(job, sub_job_id, data)
        payload = bodies.decode_frame(data, "request chunk")
        if not isinstance(payload, dict) or set(payload) != {"payload"}:
            raise BackendError("request chunk must hold exactly one payload tensor")
        accepted = job.chunks.accept(desc, data)
        if accepted.request_id is not None:
            return {"request_id": accepted.request_id, "job_id": job_id, "replayed": True}
        if accepted.frame is None:
            return {
                "job_id": job_id,
                "chunk_group_id": desc.group_id,
                "received": accepted.received,
            }
        response = self._submit_forward_backward(job, sub_job_id, accepted.frame)
        job.chunks.ran(desc, response["request_id"])
        return response

    def _submit_forward_backward(self, job: Job, sub_job_id: str, frame_bytes: bytes) -> dict:
        frame = bodies.decode_frame(frame_bytes, "forward-backward frame")
        spec = job.sub_job(sub_job_id)
        processing = frame_checks.validate_model_frame(
            frame, max_seq_len=spec.max_seq_len, vocab=job.vocab_size(sub_job_id), training=True
        )
        if self.hosted:
            hosted.check_rows_per_rank(len(frame["kwargs"]["input_ids"]), spec, "forward-backward")
            hosted.check_cce_post(processing)
        request = self.dispatcher.on_worker(
            job,
            sub_job_id,
            "forward_backward",
            {
                "op": "forward_backward",
                "processing": processing.to_json(),
                **self._result_shape(spec),
            },
            frame_bytes,
        )
        return {"request_id": request.request_id, "job_id": job.job_id}

    def forward(self, job: Job, sub_job_id: Any, sub_job_type: Any, payload: Any) -> dict:
        spec = route(
            job,
            "forward",
            sub_job_id,
            sub_job_type,
            ("log_probability", "training"),
            ("log_probability", "training"),
        )
        frame_bytes = frame_checks.forward_payload_bytes(payload)
        frame = bodies.decode_frame(frame_bytes, "forward frame")
        frame_checks.validate_model_frame(
            frame,
            max_seq_len=spec.max_seq_len,
            vocab=job.vocab_size(spec.sub_job_id),
            training=False,
        )
        if self.hosted:
            hosted.check_rows_per_rank(len(frame["kwargs"]["input_ids"]), spec, "forward")
        request = self.dispatcher.on_worker(
            job,
            spec.sub_job_id,
            "forward",
            {"op": "forward", **self._result_shape(spec)},
            frame_bytes,
        )
        return {"request_id": request.request_id, "job_id": job.job_id}

    # -- optimizer and checkpoints ----------------------------------------------------------------

    def step(self, job_id: str, body: Any) -> dict[str, Any]:
        job = self.registry.require_running(job_id)
        learning_rate = bodies.step_learning_rate(bodies.json_object(body, "step"))
        sub_job_id = training_sub_job(job, "step")
        request = self.dispatcher.on_worker(
            job, sub_job_id, "step", {"op": "step", "learning_rate": learning_rate}
        )
        return {"request_id": request.request_id, "job_id": job_id}

    def save(self, job_id: str, body: Any) -> dict[str, Any]:
        job = self.registry.require_running(job_id)
        body = bodies.json_object(body, "save")
        bodies.only_keys(body, ("checkpoint_id", "checkpoint_type"), "save")
        checkpoint_type = bodies.checkpoint_type(body.get("checkpoint_type"))
        requested = body.get("checkpoint_id")
        if self.hosted and requested is not None:  # rule checkpoint-id-ignored
            log.info("save: checkpoint_id=%s ignored (hosted-conformance mode)", abridge(requested))
            requested = None
        checkpoint_id = (
            f"cp_{uuid.uuid4().hex}" if requested is None else bodies.checkpoint_id(requested)
        )
        sub_job_id = training_sub_job(job, "save")
        store = self.registry.checkpoints
        staging = store.reserve(job_id, checkpoint_id)  # 409 when the id is taken
        handle = job.workers[sub_job_id]

        def run() -> dict[str, Any]:
            try:
                reply = handle.submit(
                    {
                        "op": "save",
                        "directory": str(staging),
                        "checkpoint_type": checkpoint_type,
                        "checkpoint_id": checkpoint_id,
                    }
                ).result()
                steps = int(worker_result(reply, "save")["global_steps"])
                final = store.publish(staging, steps)
            except BaseException:
                store.discard(job_id, checkpoint_id)
                raise
            result = {
                "job_id": job_id,
                "checkpoint_id": checkpoint_id,
                "checkpoint_type": checkpoint_type,
                "global_steps": steps,
                "stage_path": f"{final.as_posix()}/",
                "checkpoint_path": f"{final.as_posix()}/",
            }
            return hosted.save_result(result) if self.hosted else result

        request = self.dispatcher.in_server(job, sub_job_id, "save", run)
        return {"request_id": request.request_id, "job_id": job_id}

    def load(self, job_id: str, body: Any) -> dict[str, Any]:
        job = self.registry.require_running(job_id)
        body = bodies.json_object(body, "load")
        bodies.only_keys(body, ("checkpoint_id", "source_job_id", "target_sub_job_id"), "load")
        target = body.get("target_sub_job_id")
        if target is not None:
            spec = job.sub_job(target)
            if spec.job_type != "training":
                raise BackendError(
                    f"load into {spec.job_type} sub-job {target} is not implemented; "
                    "load targets the training sub-job",
                    status=501,
                )
        sub_job_id = training_sub_job(job, "load")
        source_job = bodies.job_id(body.get("source_job_id") or job_id, "source_job_id")
        checkpoint_id = bodies.checkpoint_id(body.get("checkpoint_id"))
        directory = self.registry.checkpoints.directory(source_job, checkpoint_id)
        request = self.dispatcher.on_worker(
            job, sub_job_id, "load", {"op": "load", "directory": str(directory)}
        )
        return {"request_id": request.request_id, "job_id": job_id}

    def list_checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        self.registry.get(job_id)
        return self.registry.checkpoints.list(job_id)

    def delete_checkpoint(self, job_id: str, checkpoint_id: str) -> None:
        self.registry.get(job_id)
        self.registry.checkpoints.delete(job_id, bodies.checkpoint_id(checkpoint_id))

    # -- generate ---------------------------------------------------------------------------------

    def generate(self, job_id: str, data: bytes) -> dict[str, Any]:
        job = self.registry.require_running(job_id)
        if bodies.request_chunk(data, "generate") is not None:
            raise BackendError(
                "chunked generate requests are not supported by the local backend; "
                "send under 60 MiB"
            )
        frame = bodies.decode_frame(data, "generate frame")
        samplers = job.of_type("sampling")
        if not samplers:
            raise BackendError(f"generate needs a sampling sub-job; job {job_id} has none")
        spec = samplers[0]
        routing_key = frame.get("routing_key") if isinstance(frame, dict) else None
        if len(samplers) > 1 and isinstance(routing_key, str):
            digest = int(hashlib.sha256(routing_key.encode()).hexdigest(), 16)
            spec = samplers[digest % len(samplers)]
        rows = generate_params.validate_generate(
            frame, max_seq_len=spec.max_seq_len, vocab=job.vocab_size(spec.sub_job_id)
        )
        n = len(rows)
        with job.lock:
            self._admit_rows(job, spec, n)
            request = self.dispatcher.on_worker(
                job,
                spec.sub_job_id,
                "generate",
                {
                    "op": "generate",
                    "rows": [row.to_json() for row in rows],
                    "float_logprobs": self.hosted,  # rule sampler-logprob-floats
                },
            )
        request.on_done(lambda: self._release_rows(job, spec.sub_job_id, n))
        return {"request_id": request.request_id, "job_id": job_id}

    @staticmethod
    def _admit_rows(job: Job, spec, n: int) -> None:
        """Count ``n`` more rows against the sampler's bound: what it decodes at once
        (``max_num_seqs``) plus what may wait (``max_queued_rows``). A request over the whole
        bound is a 400; one that does not fit now is a 429 (the SDK retries it)."""
        limit = spec.max_num_seqs + spec.max_queued_rows
        if n > limit:
            raise BackendError(
                f"generate has {n} prompts; sampling sub-job {spec.sub_job_id} holds at most "
                f"{limit} rows (inference_config.vllm_config max_num_seqs {spec.max_num_seqs} "
                f"+ max_queued_rows {spec.max_queued_rows})"
            )
        held = job.sampler_rows.get(spec.sub_job_id, 0)
        if held + n > limit:
            raise BackendError(
                f"sampling sub-job {spec.sub_job_id} is full: {held} rows running or queued, "
                f"{n} more asked for, limit {limit}; retry when some finish",
                status=429,
                code="sampler_queue_full",
            )
        job.sampler_rows[spec.sub_job_id] = held + n

    @staticmethod
    def _release_rows(job: Job, sub_job_id: str, n: int) -> None:
        with job.lock:
            job.sampler_rows[sub_job_id] = job.sampler_rows.get(sub_job_id, 0) - n

    # -- requests ---------------------------------------------------------------------------------

    async def wait_for_request(self, job_id: str, request_id: str) -> None:
        await self.registry.get(job_id).requests.wait(request_id)

    def request_status(
        self, job_id: str, request_id: str, cursor: str | None, max_events: int | None
    ) -> dict[str, Any]:
        return self.registry.get(job_id).requests.status(request_id, cursor, max_events)
