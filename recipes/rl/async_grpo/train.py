"""Asynchronous GRPO: rollouts and training overlap with bounded, observable policy lag.

    python -m recipes.rl.async_grpo.train                      # CPU profile, 10 steps
    python -m recipes.rl.async_grpo.train max_steps=2 profile=recipes/rl/async_grpo/configs/local-cpu-tiny-qwen3-smoke.json

Rollout workers keep up to ``max_inflight_groups`` groups in flight on the sampling sub-job
while the trainer consumes finished groups; ``max_async_level`` bounds how far sampling runs
ahead of training and ``max_off_policy_steps`` drops work that became too stale (prime-rl's
orchestration semantics, see docs/async-grpo.md). Per step: take a batch -> ``grpo``
forward-backward with the sampler's logprobs as ``old_log_probs_shifted`` -> optimiser step
-> weight sync to the sampler -> publish the new policy version. Every ``ckpt.interval``
steps the trainer saves a resumable checkpoint and the orchestrator writes its state
atomically; rerunning the command resumes from there, and a lost backend is reconnected
and resumed within the same command.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import chz

from cortex_recipes import completions, frames, profiles
from cortex_recipes.models import load_tokenizer
from cortex_recipes.primerl.launch import ENV_VAR as PRIMERL_ENV_VAR
from cortex_recipes.profiles import ProfileError
from cortex_recipes.reconnect import is_recoverable
from cortex_recipes.rl.grpo import (
    ScoredGroup,
    greedy_eval,
    group_seed,
    grpo_frame,
    sample_group,
    task_order,
)
from cortex_recipes.rl.orchestrator import AsyncOrchestrator, Intervals, overlap_seconds
from cortex_recipes.rl.policy_lag import RolloutBook
from cortex_recipes.rl.profile import GRPOProfile, load_grpo_profile
from cortex_recipes.run import CheckpointError, Run, RunConfig, Trainer, open_run, profile_field
from cortex_recipes.sampling import chat_prompt_ids

log = logging.getLogger("recipes.rl.async_grpo")
DEFAULT_PROFILE = "recipes/rl/async_grpo/configs/local-cpu-smollm2-lora.json"


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    max_steps: int = chz.field(default=0, doc="0: the profile's max_steps")
    rollouts_rate: float = completions.rate_field()
    max_reconnects: int = chz.field(
        default=3, doc="reconnects after a lost backend before the run gives up"
    )
    env_latency_s: float = chz.field(default=-1.0, doc="< 0: the profile's env.latency_s")
    # Not "orchestrator": that key overrides the profile's orchestrator section.
    runner: str = chz.field(
        default="auto",
        doc="auto (prime-rl when $CORTEX_RECIPES_PRIMERL_PYTHON is set, else builtin) | prime-rl "
        "(prime-rl's own orchestrator and env-server, in the environment that variable names; "
        "docs/async-grpo.md) | builtin (this project's scheduler, for machines without prime-rl)",
    )


RUNNERS = ("auto", "builtin", "prime-rl")


def resolve_runner(runner: str) -> str:
    """``auto`` becomes prime-rl when its environment variable is set (a wrong value then fails
    closed in the prime-rl launcher, it never falls back), builtin when it is not."""
    if runner not in RUNNERS:
        raise ProfileError(f"runner={runner!r}; accepted: {', '.join(RUNNERS)}")
    if runner != "auto":
        return runner
    chosen = "prime-rl" if os.environ.get(PRIMERL_ENV_VAR) else "builtin"
    log.info(
        "runner=auto: %s (%s is %s)",
        chosen, PRIMERL_ENV_VAR, "set" if chosen == "prime-rl" else "not set",
    )  # fmt: skip
    return chosen


def main(config: Config) -> dict:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    profile = load_grpo_profile(config.profile, config.overrides)
    if not profile.is_async:
        raise ProfileError(
            f"{config.profile}: orchestrator.max_async_level is not set; "
            "synchronous profiles belong to recipes/rl/math_grpo"
        )
    run = open_run(
        "async_grpo", profile, config,
        log_path=config.log_path, run_name=config.run_name, if_exists=config.if_exists,
    )  # fmt: skip
    if run.finished:
        return run.finished
    runner = resolve_runner(config.runner)
    written_by = (run.resume or {}).get("runner", "builtin")
    if run.resume is not None and written_by != runner:
        raise CheckpointError(
            f"{run.path}/checkpoints/step_{run.resume['step']}: written by runner="
            f"{written_by!r}, this command is runner={runner!r}; resume with the runner "
            "that wrote it, pass if_exists=overwrite or another run_name"
        )
    if runner == "prime-rl":
        return train_on_primerl(config, profile, run)

    reconnects = 0
    while True:
        run.reload_resume()
        try:
            with run.connect(
                config.connection, client_options={"max_retries": 2, "poll_timeout": 1800.0}
            ) as client:
                return train(client, config, profile, run, reconnects)
        except Exception as exc:
            if not is_recoverable(exc) or reconnects >= config.max_reconnects:
                raise
            reconnects += 1
            log.warning(
                "lost the backend (%s: %s); reconnect %d/%d, resuming after step %d",
                type(exc).__name__,
                exc,
                reconnects,
                config.max_reconnects,
                (run.checkpoints.steps() or [0])[-1],
            )
            time.sleep(min(2.0**reconnects, 30.0))


def train_on_primerl(config, profile: GRPOProfile, run: Run) -> dict:
    """prime-rl's orchestrator + env-server drive the job through the two adapters. After a
    kill, rerunning resumes both from the run's newest resume point (the eval history rides in
    it), every step logged once."""
    from cortex_recipes.primerl.journey import run_primerl

    max_steps = config.max_steps or profile.max_steps
    tokenizer = load_tokenizer(profile.model)
    _, eval_env = profile.envs()  # the builtin runner's fixed eval set, so the two compare
    with run.connect(config.connection, client_options={"poll_timeout": 1800.0}) as client:
        trainer = Trainer.start(
            client, profile.sub_jobs(), run, weight_format=profile.weight_format
        )

        def evaluate(step: int) -> dict:
            found = greedy_eval(
                client, trainer.job_id, tokenizer, eval_env, profile.eval_max_tokens
            )
            log.info("eval at step %d: accuracy %.3f", step, found["accuracy"])
            return {"step": step, "accuracy": found["accuracy"], "correct": found["correct"]}

        # On resume the before-training eval is the first run's (this job starts elsewhere).
        evals = list(run.resume["evals"]) if run.resume else [evaluate(0)]
        last: list[dict] = []

        def evaluate_last() -> float:
            # the sampler may hold the previous version: evaluate the last one
            trainer.sync()
            last.append(evaluate(max_steps))
            return last[-1]["accuracy"]

        out = run_primerl(
            client, profile, run, max_steps=max_steps, job_id=trainer.job_id,
            state={"evals": evals}, evaluate_last=evaluate_last,
        )  # fmt: skip
        if not last:  # the last step was recorded before a kill: evaluate its weights now
            evaluate_last()
        evals.append(last[-1])
        client.cancel_job(trainer.job_id)
    summary = {"profile": profile.name, "config_hash": profile.config_hash, **out}
    return run.summary({**summary, "eval_accuracy": evals})


def train(client, config, profile: GRPOProfile, run: Run, reconnects: int) -> dict:
    resume = run.resume
    max_steps = config.max_steps or profile.max_steps
    lag = profile.lag_config()
    tokenizer = load_tokenizer(profile.model)
    pad_id = frames.pad_id(tokenizer)
    env, eval_env = profile.envs()
    order = task_order(profile.env.seed, env.size)
    latency = config.env_latency_s if config.env_latency_s >= 0 else profile.env.latency_s
    params = profile.sampling_params()
    seed = profile.seed
    ckpt_interval = profile.ckpt.interval if profile.ckpt else 1

    trainer = Trainer.start(client, profile.sub_jobs(), run, weight_format=profile.weight_format)
    job_id = trainer.job_id
    if resume is not None:
        trainer.load(resume)  # and sync: the sampler serves v_{resume_step} before dispatch
        book = RolloutBook.from_state(lag, resume["book"])
        evals = resume["evals"]
        start_step = resume["step"] + 1
    else:
        book = RolloutBook(lag)
        evals = []
        start_step = 1
    book.last_step = max_steps  # no rollouts for steps that will never train
    if not evals:
        evals.append(
            {"step": 0, **greedy_eval(client, job_id, tokenizer, eval_env, profile.eval_max_tokens)}
        )
        log.info("eval before training: accuracy %.3f", evals[0]["accuracy"])

    def sample(group) -> ScoredGroup:
        task = env.task(order[group.index % env.size])
        prompt_ids = chat_prompt_ids(tokenizer, env.prompt(task))
        rollouts = sample_group(
            client,
            job_id,
            prompt_ids,
            profile.group_size,
            params,
            group_seed(seed, group.index, profile.group_size),
        )
        texts = [tokenizer.decode(r.completion_ids, skip_special_tokens=True) for r in rollouts]
        if latency:
            time.sleep(latency)  # a slow verifier or tool; overlaps with training
        return ScoredGroup(task.index, rollouts, [env.score(task, t) for t in texts])

    written = completions.RolloutWriter(run.path, tokenizer, rate=config.rollouts_rate)
    training = Intervals()
    started = time.monotonic()
    orchestrator = AsyncOrchestrator(book, sample, workers=lag.max_inflight_groups)
    run.track_steps(max_steps)
    with orchestrator:
        for step in range(start_step, max_steps + 1):
            batch, waited = orchestrator.next_batch(step)
            groups = [g.payload for g in batch.groups]
            frame, stats = grpo_frame(groups, pad_id, profile.loss_config())
            t0 = time.monotonic()
            result, _ = trainer.train_step(frame)
            trainer.sync()
            training.add(t0, time.monotonic())
            orchestrator.publish(step)
            for k, g in enumerate(batch.groups):  # sampled under policy_start, trained now
                written.write_group(
                    step=step, group=k, policy_version=g.policy_start,
                    rollouts=g.payload.rollouts, rewards=g.payload.rewards,
                )  # fmt: skip
            m = result["metrics"]
            record = {
                "step": step,
                "loss": result["avg_loss"],
                **stats,
                "policy_version": step,
                "rollout_policy_versions": [g.policy_start for g in batch.groups],
                "off_policy/mean": batch.lag_mean,
                "off_policy/max": batch.lag_max,
                "off_policy/dropped": batch.dropped,
                "mismatch_kl/mean": m.get("approx_kl"),
                "clip_ratio": m.get("clip_ratio"),
                "time/wait_for_batch": round(waited, 3),
                "time/train": round(time.monotonic() - t0, 3),
                "time/step": round(time.monotonic() - t0 + waited, 3),
                **orchestrator.gauges(),
            }
            if step % profile.eval.interval == 0 or step == max_steps:
                evals.append(
                    {
                        "step": step,
                        **greedy_eval(client, job_id, tokenizer, eval_env, profile.eval_max_tokens),
                    }
                )
                record["eval/accuracy"] = evals[-1]["accuracy"]
            if step % ckpt_interval == 0 or step == max_steps:
                record["time/save_ckpt"] = trainer.save_resumable(
                    step, {"book": orchestrator.state_dict(), "evals": evals}
                )
            run.metrics(**record)
            log.info(
                "step %d/%d reward %.3f lag mean %.2f max %d dropped %d in-flight %d eval %s",
                step,
                max_steps,
                stats["reward/mean"],
                batch.lag_mean,
                batch.lag_max,
                book.dropped_total,
                record["off_policy/in_flight/count"],
                record.get("eval/accuracy", "-"),
            )
    generation = orchestrator.generation
    segment_s = time.monotonic() - started
    client.cancel_job(job_id)

    history = run.read_metrics()
    train_s = training.total()
    summary = {
        "profile": profile.name,
        "config_hash": profile.config_hash,
        "steps": [h["step"] for h in history],
        "rewards": [h["reward/mean"] for h in history],
        "losses": [h["loss"] for h in history],
        "eval_accuracy": [
            {"step": e["step"], "accuracy": e["accuracy"], "correct": e.get("correct")}
            for e in evals
        ],
        "off_policy_max": max((h["off_policy/max"] for h in history), default=0),
        "off_policy_mean": sum(h["off_policy/mean"] for h in history) / max(len(history), 1),
        "dropped_total": book.dropped_total,
        "max_async_level": lag.max_async_level,
        "max_off_policy_steps": lag.max_off_policy_steps,
        "overlap_fraction": overlap_seconds(training, generation) / train_s if train_s else 0.0,
        "resumed_from_step": resume["step"] if resume else None,
        "reconnects": reconnects,
        "loop_time_s": round(segment_s, 2),
        "wall_time_s": round(segment_s, 1),
    }
    return run.summary(summary)


if __name__ == "__main__":
    out = main(profiles.entrypoint(Config, GRPOProfile))
    keys = ("profile", "eval_accuracy", "off_policy_max", "overlap_fraction", "wall_time_s")
    if out.get("orchestrator") == "prime-rl":
        keys = ("profile", "orchestrator", "eval_accuracy", "losses", "published_versions")
    print(json.dumps({k: out[k] for k in keys}))
    sys.exit(0)
