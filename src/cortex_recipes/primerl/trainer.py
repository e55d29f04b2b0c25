"""The trainer adapter: prime-rl's filesystem trainer protocol on a Cortex training sub-job.

prime-rl's orchestrator writes ``rollouts/step_<N>/rank_0.bin`` (steps from 1) and waits for the
trainer's ``broadcasts/step_<v>/STABLE`` (versions from 0). This adapter plays that trainer:

1. start: from scratch it saves the untouched weights as a checkpoint and publishes
   version 0; after a kill it loads the newest *published* version's resumable checkpoint
   (weights and optimizer state) and carries on at the next step. A step that was trained but
   not published is trained again from its rollout file, so nothing is half-applied.
2. step ``N``: wait for the rollout file, decode it (fails closed naming the file and field,
   :mod:`cortex_recipes.primerl.rollout_files`), build one ``grpo`` frame from all its samples
   (prime-rl's per-token advantages; ``old_log_probs_shifted`` from ``inference_logprobs``),
   ``forward_backward``; then, before the optimizer ``step``, wait until the sampler has applied
   version ``N-1`` (:mod:`cortex_recipes.primerl.broadcasts` invariant 4, the weight-version
   hazard); ``step``; save a resumable checkpoint (exactly those weights; its id goes in the version's manifest); publish
   version ``N``.

Metrics (one JSON object per step in ``<output_dir>/cortex/trainer_metrics.jsonl``): loss,
``mismatch_kl/mean``, ``clip_ratio``, ``time/step`` (the whole step, waits and save included),
``time/wait_for_batch``, ``time/wait_for_sync``, ``time/train``, ``time/save_ckpt``, and the
version published. Temperatures are not sent: the Cortex sampler
returns raw (unscaled) logprobs, which is what the trainer computes at temperature 1.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cortex_recipes import frames, save_results
from cortex_recipes.driver import sampling_version, trained_version
from cortex_recipes.primerl import broadcasts, step_records
from cortex_recipes.primerl.rollout_files import RolloutFileError, Sample, read_rows, rollout_path
from cortex_recipes.rl.grpo_profile import LR_SCHEDULES, scheduled_learning_rate

log = logging.getLogger(__name__)

METRICS = "trainer_metrics.jsonl"


@dataclass
class TrainerAdapterConfig:
    output_dir: Path  # prime-rl's orchestrator output_dir (rollouts/ and broadcasts/ live here)
    job_id: str  # a running Cortex job with one training and one sampling sub-job
    max_steps: int
    pad_id: int  # frames.pad_id(tokenizer): the one pad-id rule
    loss_config: dict[str, Any] = field(default_factory=dict)
    learning_rate: float | None = None
    # the profile's lr_schedule over max_steps (grpo_profile.scheduled_learning_rate); a
    # learning_rate of None leaves the job's optimizer lr on every step
    lr_schedule: str = "constant"
    rank: int = 0
    poll_s: float = 0.1
    # prime-rl's orchestrator waits up to 1200 s for the trainer's first version; the same
    # bound is used for every wait here.
    batch_timeout_s: float = 1200.0
    sync_timeout_s: float = 1200.0
    # With filesystem broadcasts prime-rl's orchestrator may stop before it applies
    # v{max_steps-1} (nothing samples from the last versions), so the last step waits only
    # this long; a later request for that version is then refused (409), never mislabelled.
    final_sync_timeout_s: float = 30.0
    # Called with each step's record once that version is published (the journey writes the
    # run's metrics and its resume points from it).
    on_step: Callable[[dict[str, Any]], None] | None = None


def sample_row(row: Sample) -> frames.Row:
    """A prime-rl sample as a training row (its fields are already token-aligned)."""
    return frames.Row(
        token_ids=list(row.input_ids),
        weights=[1.0 if m else 0.0 for m in row.loss_mask],
        advantages=[float(a) for a in row.advantages],
        sampler_logprobs=[float(x) for x in row.inference_logprobs],
    )


def needs_proximal(loss_config: dict[str, Any]) -> bool:
    """Whether the loss is the decoupled one with a recomputed proximal policy: the trainer
    then scores the batch under its current weights (a no-grad forward) before training it."""
    return bool(loss_config.get("use_decoupled_loss")) and (
        loss_config.get("prox_logp_method", "recompute") in ("recompute", "metrics")
    )


def needs_versions(loss_config: dict[str, Any]) -> bool:
    """Whether the loss interpolates the proximal policy by version (``loglinear``, and
    ``metrics``, which reports that estimate): the frame then carries each token's version and
    the config the trainer's (``current_version``)."""
    return bool(loss_config.get("use_decoupled_loss")) and (
        loss_config.get("prox_logp_method") in ("loglinear", "metrics")
    )


def row_versions(rows: Sequence[Sample], known: dict[tuple[int, ...], list[int]],
                 where: str) -> list[int]:  # fmt: skip
    """The version each row started at (``known``: :func:`step_records.sample_versions`), the
    last listed for a sample shipped more than once; a row the episodes file does not hold is
    refused naming it."""
    left = {key: list(values) for key, values in known.items()}
    out = []
    for index, row in enumerate(rows):
        versions = left.get(tuple(row.input_ids))
        if not versions:
            raise RolloutFileError(
                f"{where}: row {index} ({len(row.input_ids)} tokens) is in no shipped episode, "
                "so its policy version is unknown"
            )
        out.append(versions.pop())
    return out


def with_versions(frame: bytes, versions: list[int], current_version: int) -> bytes:
    """``frame`` with ``context.versions`` (each row's version on every position) and
    ``processing.config.current_version``."""
    import torch
    from cortex_training import wire

    body = wire.loads(frame)
    ids = body["kwargs"]["input_ids"]
    body["context"]["versions"] = (
        torch.tensor(versions, dtype=torch.long).unsqueeze(1).expand_as(ids).contiguous()
    )
    body["processing"]["config"] = {
        **body["processing"].get("config", {}),
        "current_version": current_version,
    }
    return wire.dumps(body, metadata=wire.read_metadata(frame) or None)


def grpo_rows_frame(
    rows: Sequence[Sample],
    pad_id: int,
    loss_config: dict[str, Any],
    score: Callable[[Any], Any] | None = None,
    versions: list[int] | None = None,
    current_version: int = 0,
) -> tuple[bytes, dict[str, Any]]:
    """One ``grpo`` forward-backward frame from prime-rl samples, and what it holds. With the
    decoupled loss (:func:`needs_proximal`), ``score(input_ids)`` gives the proximal logprobs."""
    batch = frames.pad_batch([sample_row(r) for r in rows], pad_id)
    prox = None
    if needs_proximal(loss_config):
        if score is None:
            raise ValueError(
                "the decoupled grpo loss needs a score function for the proximal policy"
            )
        prox = score(batch.input_ids)
    frame = frames.grpo_frame(batch, loss_config, prox)
    if needs_versions(loss_config):
        if versions is None:
            raise ValueError("prox_logp_method loglinear/metrics needs the rows' versions")
        frame = with_versions(frame, versions, current_version)
    mask, advantages = batch.loss_mask, batch.advantages
    stats = {
        "samples": len(rows),
        "trainable_tokens": int(mask.sum()),
        "advantage/mean": float(advantages.sum() / mask.sum()),
        "envs": sorted({r.env_name for r in rows}),
    }
    return frame, stats


class TrainerAdapter:
    def __init__(self, client, config: TrainerAdapterConfig):
        self.client = client
        self.config = config
        self.output_dir = Path(config.output_dir)
        self.version: int | None = None
        #: (start, end) of each forward-backward and optimizer step, time.monotonic()
        self.train_intervals: list[tuple[float, float]] = []
        #: set by whoever runs prime-rl once its orchestrator has exited: a wait for a rollout
        #: file or a weight sync that can no longer come raises broadcasts.Stopped
        self.stop = threading.Event()
        self.ranks: int | None = None  # the training sub-job's n_gpus, read by _training()
        self.training_id: str | None = None

    def _training(self) -> tuple[str | None, int]:
        """The training sub-job's id and data-parallel ranks (asked of the job once)."""
        if self.ranks is None:
            from cortex_recipes.endpoint import sub_job_ranks

            job = self.client.get_job(self.config.job_id)
            training = [
                s["sub_job_id"] for s in job.get("sub_jobs", []) if s.get("job_type") == "training"
            ]
            self.training_id = training[0] if training else None
            self.ranks = sub_job_ranks(job).get(self.training_id, 1) if training else 1
        return self.training_id, self.ranks

    def _ranks(self) -> int:
        return self._training()[1]

    def _score(self, input_ids):
        """The training sub-job's logprobs of ``input_ids`` under its current weights (the
        proximal policy of the decoupled loss): one no-grad forward."""
        from cortex_recipes import raw_forward

        job_id = self.config.job_id
        return raw_forward.score(self.client, job_id, input_ids, sub_job_id=self._training()[0])

    # -- start and resume ---------------------------------------------------------------

    def start(self) -> int:
        """Publish version 0, or restore the newest published version; returns it."""
        job_id = self.config.job_id
        latest = broadcasts.latest_published(self.output_dir)
        if latest is None:
            broadcasts.write_live(self.output_dir, 0, "stable", job_id)
            self._publish(0, time.monotonic())
            log.info("published version 0 (the starting weights)")
        else:
            version = latest["version"]
            source = latest["job_id"] if latest["job_id"] != job_id else None
            broadcasts.write_live(self.output_dir, version, "stepping", job_id)
            self.client.poll_request(
                job_id, self.client.load(job_id, latest["checkpoint_id"], source_job_id=source)
            )
            broadcasts.write_live(self.output_dir, version, "stable", job_id)
            log.info("resumed at version %d from checkpoint %s", version, latest["checkpoint_id"])
        self.version = broadcasts.latest_published(self.output_dir)["version"]
        return self.version

    def _publish(self, version: int, t0: float) -> dict[str, Any]:
        saved = save_results.normalised(
            self.client.poll_request(
                self.config.job_id,
                self.client.save(self.config.job_id, checkpoint_type="resumable"),
            ),
            "resumable",
        )
        broadcasts.publish(
            self.output_dir,
            version,
            {
                "job_id": self.config.job_id,
                "checkpoint_id": saved["checkpoint_id"],
                "stage_path": saved.get("stage_path"),
            },
        )
        return {"time/save_ckpt": round(time.monotonic() - t0, 3)}

    # -- one step -------------------------------------------------------------------------

    def _sampler_has(self, version: int) -> bool:
        job_id = self.config.job_id
        if version == 0 and broadcasts.latest_applied(self.output_dir, job_id) is None:
            return True  # nothing was ever synced: the sampler holds the base weights, v0
        return broadcasts.is_applied(self.output_dir, version, job_id)

    def _wait_for_sampler(self, step: int) -> float:
        """Seconds until the sampler holds the version step ``step`` samples from
        (:func:`cortex_recipes.driver.sampling_version`; invariant 4 of broadcasts)."""
        final, version = step == self.config.max_steps, sampling_version(step)
        t0 = time.monotonic()
        try:
            return broadcasts.wait_for(
                lambda: self._sampler_has(version),
                timeout_s=self.config.final_sync_timeout_s if final else self.config.sync_timeout_s,
                poll_s=self.config.poll_s,
                what=f"the sampler to apply version {version} (its APPLIED marker)",
                stop=self.stop,
            )
        except (TimeoutError, broadcasts.Stopped):
            # the orchestrator may exit without applying the version before the last one
            if not final:
                raise
            log.warning("last step %d: version %d was not applied; stepping anyway", step, version)
            return time.monotonic() - t0

    def learning_rate(self, step: int) -> float | None:
        config = self.config
        if config.learning_rate is None:
            return None
        return scheduled_learning_rate(
            config.learning_rate, config.lr_schedule, step, config.max_steps
        )

    def train_step(self, step: int) -> dict[str, Any]:
        config, job_id = self.config, self.config.job_id
        # the version this step's rollouts were asked of, and the one its optimiser step makes
        behind, version = sampling_version(step), trained_version(step)
        if self.version != behind:
            raise RuntimeError(f"step={step} needs version {behind}; trainer holds {self.version}")
        t_step = time.monotonic()
        path = rollout_path(self.output_dir, step, config.rank)
        waited = broadcasts.wait_for(
            path.is_file, timeout_s=config.batch_timeout_s, poll_s=config.poll_s, what=str(path),
            stop=self.stop,
        )  # fmt: skip
        rows = read_rows(path)
        t_train = time.monotonic()
        versions = None
        if needs_versions(config.loss_config):
            known = step_records.sample_versions(self.output_dir, step)
            versions = row_versions(rows, known, str(path))
        frame, stats = grpo_rows_frame(
            rows, config.pad_id, config.loss_config, self._score, versions, behind
        )
        frame = frames.for_ranks(frame, self._ranks())
        result = self.client.poll_request(job_id, self.client.forward_backward(job_id, frame))
        self.train_intervals.append((t_train, time.monotonic()))
        synced = self._wait_for_sampler(step)
        broadcasts.write_live(self.output_dir, behind, "stepping", job_id)
        t_opt = time.monotonic()
        stepped = self.client.poll_request(
            job_id, self.client.step(job_id, learning_rate=self.learning_rate(step))
        )
        self.train_intervals.append((t_opt, time.monotonic()))
        train_s = time.monotonic() - t_train - synced
        saved = self._publish(version, time.monotonic())
        broadcasts.write_live(self.output_dir, version, "stable", job_id)
        self.version = version
        record = {
            "step": step,
            "policy_version": version,
            "loss": result.get("avg_loss"),
            "mismatch_kl/mean": (result.get("metrics") or {}).get("approx_kl"),
            # the share of trained tokens whose PPO ratio was clipped (no gradient through them)
            "clip_ratio": (result.get("metrics") or {}).get("clip_ratio"),
            # the off-policy correction's statistics (the decoupled loss: the mean behaviour
            # weight prox / old over trained tokens, and the share dropped above its cap)
            **{
                f"correction/{key}": (result.get("metrics") or {})[key]
                for key in ("behave_imp_weight", "behave_masked_fraction")
                if key in (result.get("metrics") or {})
            },
            "grad_norm": (stepped or {}).get("grad_norm"),
            "lr": self.learning_rate(step),
            **stats,
            "time/wait_for_batch": round(waited, 3),
            "time/wait_for_sync": round(synced, 3),
            "time/train": round(train_s, 3),
            **saved,
            "time/step": round(time.monotonic() - t_step, 3),
        }
        metrics = self.output_dir / "cortex" / METRICS
        metrics.parent.mkdir(parents=True, exist_ok=True)
        with open(metrics, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        log.info(
            "step %d: %d samples, loss %s, published v%d", step, len(rows), record["loss"], version
        )
        if config.on_step is not None:
            config.on_step(record)
        return record

    def train_steps(self) -> list[dict[str, Any]]:
        """After :meth:`start`: train until ``max_steps`` is published."""
        if self.version is None:
            raise RuntimeError("train_steps() before start(): no version is held")
        return [
            self.train_step(step) for step in range(self.version + 1, self.config.max_steps + 1)
        ]

    def run(self) -> list[dict[str, Any]]:
        """Start (or resume) and train until ``max_steps`` is published."""
        self.start()
        return self.train_steps()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cortex_recipes.primerl.trainer --connection FILE --job-id ID ...``"""
    import argparse

    from cortex_recipes.console import DEBUG_LOG, sdk_output_to
    from cortex_recipes.endpoint import connect

    parser = argparse.ArgumentParser(prog="python -m cortex_recipes.primerl.trainer")
    parser.add_argument("--connection", required=True, help="a connection file (endpoint.py)")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--max-steps", required=True, type=int)
    parser.add_argument(
        "--pad-id", type=int, required=True, help="frames.pad_id of the model's tokenizer"
    )
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--lr-schedule", default="constant", choices=LR_SCHEDULES)
    parser.add_argument("--loss-config", default="{}", help="grpo processor config (JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = TrainerAdapterConfig(
        output_dir=args.output_dir,
        job_id=args.job_id,
        max_steps=args.max_steps,
        pad_id=args.pad_id,
        learning_rate=args.learning_rate,
        lr_schedule=args.lr_schedule,
        loss_config=json.loads(args.loss_config),
    )
    with (
        sdk_output_to(args.output_dir / DEBUG_LOG),  # the SDK's operation bodies, off stdout
        connect(args.connection, client_options={"poll_timeout": 600}) as client,
    ):
        TrainerAdapter(client, config).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
