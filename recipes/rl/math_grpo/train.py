"""Math GRPO, synchronous: the step-by-step SDK example of a GRPO loop.

    python -m recipes.rl.math_grpo.train                      # CPU profile, 10 steps
    python -m recipes.rl.math_grpo.train max_steps=2 profile=recipes/rl/math_grpo/configs/local-cpu-tiny-qwen3-smoke.json

Every step does the same five things, one after the other, on the current policy:
1. sample ``group_size`` completions for each of ``batch_size / group_size`` problems
   (one generate request, token ids and sampler logprobs back);
2. score them with the reasoning-gym scorer; advantages are ``reward - group mean``;
3. ``forward_backward`` with the ``grpo`` processor (the sampler's logprobs as
   ``old_log_probs_shifted``);
4. ``step``;
5. ``weight_sync`` the new weights to the sampler.
Nothing overlaps, so every batch is on-policy. recipes/rl/async_grpo is the overlapped version.
The run lives in ``runs/math_grpo/<run_name>/`` (cortex_recipes.run): a resumable save every
``ckpt.interval`` steps (when the profile sets one) and after the last step; rerunning the
command resumes.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import chz

from cortex_recipes import completions, frames, profiles
from cortex_recipes.models import load_tokenizer
from cortex_recipes.profiles import ProfileError
from cortex_recipes.rl.grpo import ScoredGroup, greedy_eval, group_seed, grpo_frame, task_order
from cortex_recipes.rl.profile import GRPOProfile, load_grpo_profile
from cortex_recipes.rollouts import rollouts_from_results
from cortex_recipes.run import RunConfig, profile_field
from cortex_recipes.sampling import chat_prompt_ids, generate
from cortex_recipes.training_job import Trainer

log = logging.getLogger("recipes.rl.math_grpo")
DEFAULT_PROFILE = "recipes/rl/math_grpo/configs/local-cpu-smollm2-lora.json"


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    max_steps: int = chz.field(
        validator=profiles.at_least(0, "0: the profile's max_steps"),
        default=0,
        doc="0: the profile's max_steps",
    )
    rollouts_rate: float = completions.rate_field()
    env_latency_s: float = chz.field(default=-1.0, doc="< 0: the profile's env.latency_s")


def main(config: Config) -> dict:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    profile = load_grpo_profile(config.profile, config.overrides)
    if profile.is_async:
        raise ProfileError(
            f"{config.profile} sets orchestrator.max_off_policy_steps: asynchronous profiles "
            "belong to recipes/rl/async_grpo"
        )
    max_steps = config.max_steps or profile.max_steps
    latency = config.env_latency_s if config.env_latency_s >= 0 else profile.env.latency_s
    ckpt_interval = profile.ckpt.interval if profile.ckpt else 0  # 0: after the last step only
    run = config.open_run("math_grpo", profile)
    if run.finished:
        return run.finished
    tokenizer = load_tokenizer(profile.model)
    pad_id = frames.pad_id(tokenizer)
    env, eval_env = profile.envs()
    order = task_order(profile.env.seed, env.size)
    evals = run.resume["evals"] if run.resume else []
    written = completions.RolloutWriter(run.path, tokenizer, rate=config.rollouts_rate)
    started = time.monotonic()

    with run.connect(config.connection) as client:
        trainer = Trainer.start(
            client, profile.sub_jobs(), run, weight_format=profile.weight_format
        )
        job_id = trainer.job_id
        if run.resume:
            trainer.load(run.resume)  # and sync: the sampler serves the resumed policy
        if not evals:
            evals.append(
                {
                    "step": 0,
                    **greedy_eval(client, job_id, tokenizer, eval_env, profile.eval_max_tokens),
                }
            )

        loop_started = time.monotonic()
        run.track_steps(max_steps)
        for step in range((run.resumed_from_step or 0) + 1, max_steps + 1):
            t0 = time.monotonic()
            # 1. Sample: group g of the run is task order[g], every rollout with its own seed.
            first = (step - 1) * profile.groups_per_step
            tasks = [
                env.task(order[(first + g) % env.size]) for g in range(profile.groups_per_step)
            ]
            prompts, rows = [], []
            for g, task in enumerate(tasks):
                prompt = chat_prompt_ids(tokenizer, env.prompt(task))
                seed = group_seed(profile.seed, first + g, profile.group_size)
                for i in range(profile.group_size):
                    prompts.append(prompt)
                    rows.append({**profile.sampling_params(), "logprobs": 0, "seed": seed + i})
            rollouts = rollouts_from_results(prompts, generate(client, job_id, prompts, rows))
            # 2. Score: reasoning-gym's scorer; group-relative advantages happen in the frame.
            groups = []
            for g, task in enumerate(tasks):
                group = rollouts[g * profile.group_size : (g + 1) * profile.group_size]
                texts = [
                    tokenizer.decode(r.completion_ids, skip_special_tokens=True) for r in group
                ]
                groups.append(ScoredGroup(task.index, group, [env.score(task, t) for t in texts]))
            for g, group in enumerate(groups):  # synchronous: sampled by the previous step's policy
                written.write_group(
                    step=step, group=g, policy_version=step - 1,
                    rollouts=group.rollouts, rewards=group.rewards,
                )  # fmt: skip
            if latency:
                time.sleep(latency)  # the verifier scores all groups of the step concurrently
            t_sampled = time.monotonic()
            # 3-5. Train on the batch, step, and put the new weights on the sampler.
            frame, stats = grpo_frame(groups, pad_id, profile.loss_config())
            result, _ = trainer.train_step(frame)
            trainer.sync()
            record = {
                "step": step,
                "loss": result["avg_loss"],
                **stats,
                "policy_version": step,
                "mismatch_kl/mean": result["metrics"].get("approx_kl"),
                "time/rollouts": round(t_sampled - t0, 3),
                "time/train": round(time.monotonic() - t_sampled, 3),
                "time/step": round(time.monotonic() - t0, 3),
            }
            if step % profile.eval.interval == 0 or step == max_steps:
                evals.append(
                    {
                        "step": step,
                        **greedy_eval(client, job_id, tokenizer, eval_env, profile.eval_max_tokens),
                    }
                )
                record["eval/accuracy"] = evals[-1]["accuracy"]
            if (ckpt_interval and step % ckpt_interval == 0) or step == max_steps:
                record["time/save_ckpt"] = trainer.save_resumable(step, {"evals": evals})
            run.metrics(**record)
            log.info(
                "step %d/%d reward %.3f loss %.4f eval %s",
                step,
                max_steps,
                stats["reward/mean"],
                record["loss"],
                record.get("eval/accuracy", "-"),
            )
        loop_s = time.monotonic() - loop_started
        client.cancel_job(job_id)

    history = run.read_metrics()
    return run.summary(
        {
            "profile": profile.name,
            "config_hash": profile.config_hash,
            "steps": [h["step"] for h in history],
            "rewards": [h["reward/mean"] for h in history],
            "losses": [h["loss"] for h in history],
            "eval_accuracy": [
                {"step": e["step"], "accuracy": e["accuracy"], "correct": e.get("correct")}
                for e in evals
            ],
            "resumed_from_step": run.resumed_from_step,
            "loop_time_s": round(loop_s, 2),
            "wall_time_s": round(time.monotonic() - started, 1),
        }
    )


def summary_line(out: dict) -> str:
    return json.dumps({k: out[k] for k in ("profile", "eval_accuracy", "rewards", "wall_time_s")})


if __name__ == "__main__":
    sys.exit(profiles.command_line(Config, GRPOProfile, main, summary_line))
