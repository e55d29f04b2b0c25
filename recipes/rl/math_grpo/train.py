"""Math GRPO, synchronous: the step-by-step SDK example of a GRPO loop.

    python -m recipes.rl.math_grpo.train                      # CPU profile, 10 steps
    python -m recipes.rl.math_grpo.train steps=2 profile=recipes/rl/math_grpo/configs/local-cpu-tiny-qwen3-smoke.json

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

from cortex_recipes import completions, driver, frames
from cortex_recipes.models import load_tokenizer
from cortex_recipes.profiles import ProfileError
from cortex_recipes.rl.grpo import ScoredGroup, greedy_eval, group_seed, grpo_frame, task_order
from cortex_recipes.rl.grpo_profile import GRPOProfile, load_grpo_profile
from cortex_recipes.rollouts import rollouts_from_results
from cortex_recipes.run import RunConfig, command_line, profile_field
from cortex_recipes.sampling import chat_prompt_ids, generate
from cortex_recipes.training_job import Trainer

log = logging.getLogger("recipes.rl.math_grpo")
DEFAULT_PROFILE = "recipes/rl/math_grpo/configs/local-cpu-smollm2-lora.json"


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    rollouts_rate: float = completions.rate_field()
    env_latency_s: float = chz.field(default=-1.0, doc="< 0: the profile's env.latency_s")


class MathGRPO:
    """Synchronous GRPO for :func:`cortex_recipes.driver.drive`: each step samples, scores,
    trains and syncs, in that order; a greedy eval before the first step and on the profile's
    eval steps."""

    log_keys = (("reward/mean", ".3f"), ("loss", ".4f"), ("eval/accuracy", ".3f"))

    def __init__(self, config: Config, profile: GRPOProfile, run):
        self.profile = profile
        self.tokenizer = load_tokenizer(profile.model)
        self.pad_id = frames.pad_id(self.tokenizer)
        self.env, self.eval_env = profile.envs()
        self.order = task_order(profile.env.seed, self.env.size)
        self.steps = config.steps_for(profile)
        self.latency = config.env_latency_s if config.env_latency_s >= 0 else profile.env.latency_s
        self.written = completions.RolloutWriter(
            run.path, self.tokenizer, rate=config.rollouts_rate
        )
        self.run = run
        self.evals: list[dict] = []

    def start(self, client, run, stack) -> Trainer:
        self.client = client
        self.trainer = Trainer.start(
            client, self.profile.sub_jobs(), run, weight_format=self.profile.weight_format
        )
        return self.trainer  # a resume loads and syncs it: the sampler serves that policy

    def restore(self, state: dict) -> None:
        self.evals = state["evals"]

    def begin(self) -> None:
        if not self.evals:
            self.evals.append({"step": 0, **self.greedy()})

    def step(self, step: int) -> dict:
        profile, env, t0 = self.profile, self.env, time.monotonic()
        # 1. Sample: group g of the run is task order[g], every rollout with its own seed.
        first = (step - 1) * profile.groups_per_step
        tasks = [
            env.task(self.order[(first + g) % env.size]) for g in range(profile.groups_per_step)
        ]
        prompts, rows = [], []
        for g, task in enumerate(tasks):
            prompt = chat_prompt_ids(self.tokenizer, env.prompt(task))
            seed = group_seed(profile.seed, first + g, profile.group_size)
            for i in range(profile.group_size):
                prompts.append(prompt)
                rows.append({**profile.sampling_params(), "logprobs": 0, "seed": seed + i})
        job_id = self.trainer.job_id
        rollouts = rollouts_from_results(prompts, generate(self.client, job_id, prompts, rows))
        # 2. Score: reasoning-gym's scorer; group-relative advantages happen in the frame.
        groups = []
        for g, task in enumerate(tasks):
            group = rollouts[g * profile.group_size : (g + 1) * profile.group_size]
            texts = [
                self.tokenizer.decode(r.completion_ids, skip_special_tokens=True) for r in group
            ]
            groups.append(ScoredGroup(task.index, group, [env.score(task, t) for t in texts]))
        for g, group in enumerate(groups):
            self.written.write_group(
                step=step, group=g, policy_version=driver.sampling_version(step),
                rollouts=group.rollouts, rewards=group.rewards,
            )  # fmt: skip
        if self.latency:
            time.sleep(self.latency)  # every rollout waits on its environment, all concurrently
        t_sampled = time.monotonic()
        # 3-5. Train on the batch, step, and put the new weights on the sampler.
        frame, stats = grpo_frame(groups, self.pad_id, profile.loss_config())
        result, _ = self.trainer.train_step(
            frame, learning_rate=profile.learning_rate_at(step, self.steps)
        )
        self.trainer.sync()
        return {
            "loss": result["avg_loss"],
            **stats,
            "policy_version": driver.trained_version(step),
            "mismatch_kl/mean": result["metrics"].get("approx_kl"),
            "time/rollouts": round(t_sampled - t0, 3),
            "time/train": round(time.monotonic() - t_sampled, 3),
        }

    def evaluate(self, step: int) -> dict:
        self.evals.append({"step": step, **self.greedy()})
        return {"eval/accuracy": self.evals[-1]["accuracy"]}

    def greedy(self) -> dict:
        return greedy_eval(
            self.client, self.trainer.job_id, self.tokenizer, self.eval_env,
            self.profile.eval_max_tokens,
        )  # fmt: skip

    def state(self) -> dict:
        return {"evals": self.evals}

    def finish(self, client) -> dict:
        client.cancel_job(self.trainer.job_id)
        history = self.run.read_metrics()
        return {
            "steps": [h["step"] for h in history],
            "rewards": [h["reward/mean"] for h in history],
            "losses": [h["loss"] for h in history],
            "eval_accuracy": [
                {"step": e["step"], "accuracy": e["accuracy"], "correct": e.get("correct")}
                for e in self.evals
            ],
        }


def main(config: Config) -> dict:
    driver.start_logging()
    profile = load_grpo_profile(config.profile, config.overrides)
    if profile.is_async:
        raise ProfileError(
            f"{config.profile} sets orchestrator.max_off_policy_steps: asynchronous profiles "
            "belong to recipes/rl/async_grpo"
        )
    loss = profile.loss
    if loss.use_decoupled_loss and loss.prox_logp_method == "loglinear":
        raise ProfileError(
            "loss.prox_logp_method='loglinear' interpolates the proximal policy by each "
            "rollout's policy version, an async setting: the synchronous loop trains on-policy "
            "rollouts and sends no versions (use prox_logp_method=recompute, or drop "
            "loss.use_decoupled_loss, which is the identity on on-policy rollouts)"
        )
    run = config.open_run("math_grpo", profile)
    if run.finished:
        return run.finished
    run.prelaunch(config.connection)  # the local backend starts while the data loads
    schedule = driver.Schedule(
        config.steps_for(profile),
        eval_every=profile.eval.interval,
        ckpt_every=profile.ckpt.interval if profile.ckpt else 0,
        ckpt_last=True,
    )
    return driver.drive(
        run, config.connection, MathGRPO(config, profile, run), schedule, profile_name=profile.name
    )


def summary_line(out: dict) -> str:
    """The result as one JSON line, then the run's next steps."""
    if "profile" not in out:  # stopped before its end (stop_after): it says how to go on
        return json.dumps(out)
    line = json.dumps({k: out[k] for k in ("profile", "eval_accuracy", "rewards", "wall_time_s")})
    return "\n".join([line, *driver.next_steps(out["run_dir"])])


if __name__ == "__main__":
    sys.exit(command_line(Config, GRPOProfile, main, summary_line))
