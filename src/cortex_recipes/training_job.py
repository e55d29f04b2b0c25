"""A job's training sub-job as a journey drives it: the train step, the weight sync, the
weights-only and resumable saves (recorded in the run, with the checkpoint id read from
whichever shape the endpoint answered, :mod:`cortex_recipes.save_results`), and loading a resume
state."""

from __future__ import annotations

import logging
import time
from typing import Any

from cortex_recipes import frames, save_results
from cortex_recipes.run import Run
from cortex_recipes.run_store import MANIFEST_FILE, MANIFESTED, local_checkpoint

log = logging.getLogger(__name__)


def save_resume_point(
    run: Run, step: int, state: dict[str, Any], trainer: dict[str, Any], **line: Any
) -> None:
    """The run's resume point at ``step``, in the one format every journey writes and
    :meth:`cortex_recipes.run.RunCheckpoints.load` reads back: ``state`` with the run's config
    hash and ``trainer`` (the resumable trainer checkpoint: ``job_id``, ``checkpoint_id``,
    ``stage_path``) in ``checkpoints/step_N/state.json``, then its ``checkpoints.jsonl`` line
    (with ``line``, what else the journey records about the save). The state is written first:
    a run killed between the two resumes from it and logs nothing twice."""
    directory = local_checkpoint(run.backend_dir, trainer)
    if directory is not None and (directory / MANIFEST_FILE).is_file():
        state = {**state, MANIFESTED: True}  # from now on this run needs the proof (run_store)
    run.checkpoints.save(step, {**state, "config_hash": run.config_hash, "trainer": trainer})
    run.checkpoint(step=step, checkpoint_type="resumable", **trainer, **line)


class Trainer:
    """A job's training sub-job: the train step, the weight sync and the saves, in one place."""

    def __init__(self, client: Any, job_id: str, run: Run, *, weight_format: str = "hf"):
        from cortex_recipes.endpoint import sub_job_ids, sub_job_ranks

        self.client, self.job_id, self.run = client, job_id, run
        job = client.wait_for_job(job_id)
        self.sub_jobs = sub_job_ids(job)
        # data-parallel ranks of the training sub-job: frames are fitted to them (frames.for_ranks)
        self.ranks = sub_job_ranks(job).get(self.sub_jobs.get("training"), 1)
        self.weight_format = weight_format

    @classmethod
    def start(cls, client: Any, sub_jobs: list, run: Run, **kwargs: Any) -> Trainer:
        """Create the job, wait until its sub-jobs run, and bind its training sub-job."""
        return cls(client, client.create_job(sub_jobs), run, **kwargs)

    def poll(self, request_id: str) -> dict:
        return self.client.poll_request(self.job_id, request_id)

    def train_step(self, frame: bytes, *, learning_rate: float | None = None) -> tuple[dict, dict]:
        """forward_backward on ``frame`` (fitted to the trainer's ranks) then an optimiser step:
        ``(result, step result)``."""
        frame = frames.for_ranks(frame, self.ranks)
        result = self.poll(self.client.forward_backward(self.job_id, frame))
        stepped = self.poll(self.client.step(self.job_id, learning_rate=learning_rate))
        return result, stepped

    def sync(self, targets: list[str] | None = None) -> None:
        """Put the trainer's weights on ``targets`` (default: the sampling sub-job)."""
        targets = targets or [self.sub_jobs["sampling"]]
        self.poll(
            self.client.weight_sync(
                self.job_id, self.sub_jobs["training"], targets, weight_format=self.weight_format
            )
        )

    def save_weights(self, step: int) -> dict:
        """A weights-only save, recorded in checkpoints.jsonl; returns the save result."""
        saved = save_results.normalised(
            self.poll(self.client.save(self.job_id, checkpoint_type="weights-only")), "weights-only"
        )
        self.run.checkpoint(
            step=step, job_id=self.job_id,
            **{k: saved[k] for k in ("checkpoint_id", "stage_path", "checkpoint_type")},
        )  # fmt: skip
        return saved

    def save_resumable(self, step: int, state: dict[str, Any]) -> None:
        """A resumable trainer save, then ``state`` next to it (the order resume relies on);
        its ``checkpoints.jsonl`` line carries the seconds it took (``time/save_ckpt``)."""
        t0 = time.monotonic()
        saved = save_results.normalised(
            self.poll(self.client.save(self.job_id, checkpoint_type="resumable")), "resumable"
        )
        trainer = {"job_id": self.job_id, **{k: saved[k] for k in ("checkpoint_id", "stage_path")}}
        seconds = round(time.monotonic() - t0, 3)
        save_resume_point(self.run, step, state, trainer, **{"time/save_ckpt": seconds})

    def load(self, checkpoint: dict[str, Any], *, sync: bool = True) -> None:
        """Load a resume state's trainer checkpoint (and, by default, sync the sampler)."""
        source = checkpoint["trainer"]
        self.poll(
            self.client.load(self.job_id, source["checkpoint_id"], source_job_id=source["job_id"])
        )
        if sync and "sampling" in self.sub_jobs:
            self.sync()
        log.info("resumed from step %d (trainer checkpoint %s)", checkpoint["step"], source)
