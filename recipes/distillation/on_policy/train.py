"""On-policy distillation: the student trains on its own rollouts, scored by a frozen teacher.

    python -m recipes.distillation.on_policy.train    # the Snowflake teacher, with a task reward
    python -m recipes.distillation.on_policy.train profile=recipes/distillation/on_policy/configs/local-cpu-smollm2-teacher.json

A profile with ``teacher_sft`` first makes its teacher: the SFT journey's run of that profile
(trained, or reused when finished), exported with LoRA merged (teacher_sft.py). A profile
with a ``reward`` samples ``group_size`` rollouts per prompt and adds group-relative reward
advantages to the teacher term, so ``teacher_tau=0`` is the reward-only run of the same loop.
At start-up an alignment probe scores the student sampler's own completions on the
student trainer through the teacher's scoring path and requires the sampler's logprobs back
(distill.teacher.check_alignment). Per step: the student sampler generates completions; the frozen teacher (a ``log_probability``
sub-job) scores the exact prompt + sampled token ids; the scores, aligned to the loss mask,
go to the ``grpo`` processor as ``teacher_log_probs_shifted`` with ``teacher_tau`` and
clipping; the student steps; its weights are synced to the student sampler only. The teacher's
fingerprint (its scores on a fixed probe) is compared at every eval, at a resume and at the
end; a change stops the run. The run lives
in ``runs/opd/<run_name>/`` (cortex_recipes.run); rerunning the command resumes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sys
import time

import chz
import torch

from cortex_recipes import completions, driver, frames, profiles, progress, raw_forward
from cortex_recipes.distill import teacher as teacher_lib
from cortex_recipes.distill.opd_profile import OPDProfile, load_opd_profile
from cortex_recipes.models import load_tokenizer
from cortex_recipes.rl.grpo import group_advantages
from cortex_recipes.rollouts import Rollout, rollouts_from_results
from cortex_recipes.run import RunConfig, command_line, profile_field
from cortex_recipes.sampling import chat_prompt_ids, generate
from cortex_recipes.training_job import Trainer
from recipes.distillation.on_policy import teacher_sft

log = logging.getLogger("recipes.distillation.on_policy")
DEFAULT_PROFILE = "recipes/distillation/on_policy/configs/local-cpu-smollm2-snowflake.json"
EVAL_SEED = 12345


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    rollouts_rate: float = completions.rate_field()
    ckpt_interval: int = profiles.count_field(
        "> 0: a resumable save every this many steps (a resume point)", meaning="0: none"
    )
    eval_interval: int = profiles.count_field(
        "> 0: evaluate every this many steps (and the last); 0: the profile's eval_interval",
        meaning="0: the profile's",
    )
    teacher_run: str = chz.field(
        default="",
        doc="the SFT run folder of a teacher_sft profile (default: teacher-sft/ inside this "
        "run's folder; name the SFT journey's run, runs/sft/<teacher_sft>, to reuse it)",
    )


def teacher_fingerprint(client, job_id: str, teacher_id: str, probe: list[int]) -> str:
    """Hash of the teacher's logprobs on a fixed probe: equal at start and end => teacher frozen."""
    logprobs = raw_forward.score(client, job_id, torch.tensor([probe]), sub_job_id=teacher_id)
    return hashlib.sha256(logprobs.float().numpy().tobytes()).hexdigest()[:16]


def rollout(client, job_id: str, prompts: list[list[int]], params: dict) -> list[Rollout]:
    """One sample per prompt; a ``seed`` is the first row's, and row ``i`` gets ``seed + i``."""
    rows: dict | list[dict] = {**params, "logprobs": 0}
    if "seed" in params:
        rows = [{**params, "logprobs": 0, "seed": params["seed"] + i} for i in range(len(prompts))]
    return rollouts_from_results(prompts, generate(client, job_id, prompts, rows))


def per_row_kl(batch) -> list[float]:
    """Each row's mean ``log p_student - log p_teacher`` over its sampled tokens."""
    student, teacher, mask = (
        batch.old_log_probs_shifted, batch.teacher_log_probs_shifted, batch.loss_mask,
    )  # fmt: skip
    return [
        teacher_lib.reverse_kl_on_samples(student[i : i + 1], teacher[i : i + 1], mask[i : i + 1])
        for i in range(mask.shape[0])
    ]


def evaluate(
    client,
    job_id: str,
    teacher: str,
    prompts: list[list[int]],
    params: dict,
    pad_id: int,
    tokenizer,
    reward,
) -> dict:
    """The held-out eval: teacher reverse KL of samples drawn with a fixed seed (token mean,
    and per prompt), and with a reward the greedy answers' task accuracy (per prompt)."""
    with progress.task(f"eval: teacher reverse KL on {len(prompts)} prompts"):
        rollouts = rollout(client, job_id, prompts, {**params, "seed": EVAL_SEED})
        batch = teacher_lib.score(client, job_id, teacher, rollouts, pad_id)
    out = {
        "teacher_reverse_kl": teacher_lib.reverse_kl_on_samples(
            batch.old_log_probs_shifted, batch.teacher_log_probs_shifted, batch.loss_mask
        ),
        "items": {"teacher_reverse_kl": per_row_kl(batch)},
    }
    if reward is not None:
        with progress.task(f"eval: {len(prompts)} greedy answers"):
            greedy = generate(client, job_id, prompts, {**params, "temperature": 0.0})
        answers = [tokenizer.decode(r["token_ids"], skip_special_tokens=True) for r in greedy]
        correct = [reward.score(a) for a in answers]
        out["accuracy"] = sum(correct) / len(correct)
        out["items"]["correct"] = correct
        out["examples"] = answers[:4]
    return out


def step_advantages(scored, rewards: list[float] | None, group_size: int, config: dict):
    """Base advantages per token: the group-relative reward (when there is a reward) on each
    row's sampled tokens, plus the teacher baseline (minus the batch mean of the teacher term)."""
    mask = scored.loss_mask
    advantages = teacher_lib.teacher_baseline(
        scored.old_log_probs_shifted, scored.teacher_log_probs_shifted, mask, config
    )
    if rewards is not None:
        per_row = [
            a
            for g in range(0, len(rewards), group_size)
            for a in group_advantages(rewards[g : g + group_size])
        ]
        advantages = advantages + torch.tensor(per_row, dtype=mask.dtype)[:, None] * mask
    return advantages


class OPD:
    """On-policy distillation for :func:`cortex_recipes.driver.drive` (module docstring)."""

    log_keys = (("teacher_reverse_kl", ".3f"), ("reward/mean", ".3f"),
                ("teacher_term_token_count", ""))  # fmt: skip

    def __init__(self, config: Config, profile: OPDProfile, run, steps: int):
        self.profile, self.run, self.steps = profile, run, steps
        self.teacher_source = None
        self.teacher_model = profile.teacher_model
        if profile.teacher_sft:
            self.teacher_source = teacher_sft.prepare(
                profile.teacher_sft, profile.teacher_model,
                connection=config.connection,
                run_dir=config.teacher_run or run.path / teacher_sft.TEACHER_DIR,
            )  # fmt: skip
            self.teacher_model = self.teacher_source["model"]
            log.info("teacher: %s (SFT %s, checkpoint %s)", self.teacher_model,
                     profile.teacher_sft, self.teacher_source["checkpoint_id"])  # fmt: skip
        self.tokenizer = tok = load_tokenizer(profile.model)
        teacher_lib.check_same_tokenizer(tok, load_tokenizer(self.teacher_model))
        self.prompt_ids = [chat_prompt_ids(tok, p) for p in profile.prompt_texts()]
        self.eval_ids = [chat_prompt_ids(tok, p) for p in profile.eval_prompt_texts()]
        self.pad_id = frames.pad_id(tok)
        self.rng = random.Random(profile.seed)
        self.written = completions.RolloutWriter(run.path, tok, rate=config.rollouts_rate)
        self.params = {
            "max_tokens": profile.max_tokens,
            "temperature": profile.temperature,
            "stop_token_ids": [tok.eos_token_id],
        }
        self.reward, self.group = profile.reward, profile.group_size
        self.evals: list[dict] = []

    def start(self, client, run, stack) -> Trainer:
        self.client = client
        self.trainer = Trainer.start(
            client, self.profile.sub_jobs(teacher=self.teacher_model), run,
            weight_format=self.profile.weight_format,
        )  # fmt: skip
        self.job_id, self.teacher = self.trainer.job_id, self.trainer.sub_jobs["log_probability"]
        self.fingerprints = [self.fingerprint()]
        return self.trainer  # a resume loads and syncs it: the student sampler serves that policy

    def restore(self, state: dict) -> None:
        self.rng.setstate(_rng_state(state["rng"]))
        self.evals = state["evals"]
        self.fingerprints = [*state["teacher_fingerprints"], *self.fingerprints]
        _check_frozen(self.fingerprints, "at the resume")

    def begin(self) -> None:
        # The trainer and the student sampler hold the same weights here, so scoring the
        # sampler's own completions on the trainer through the teacher path must give back the
        # sampler's logprobs: proof that teacher scores land on the tokens they score.
        probe = rollout(
            self.client, self.job_id, self.prompt_ids[:2],
            {"max_tokens": self.profile.max_tokens, "temperature": 1.0, "seed": 424242},
        )  # fmt: skip
        self.alignment = teacher_lib.check_alignment(
            self.client, self.job_id, self.trainer.sub_jobs["training"], probe, self.pad_id,
            self.profile.alignment_tolerance,
        )  # fmt: skip
        log.info(
            "alignment probe: %d tokens, forward vs sampler logprobs mean |diff| %.2e (max %.2e)",
            self.alignment["positions"], self.alignment["mean_abs_diff"],
            self.alignment["max_abs_diff"],
        )  # fmt: skip
        if not self.evals:
            self.evals = [{"step": 0, **self.held_out()}]
            log.info("eval before training: %s", _eval_line(self.evals[0]))

    def step(self, step: int) -> dict:
        profile, group, t0 = self.profile, self.group, time.time()
        chosen = [
            self.prompt_ids[self.rng.randrange(len(self.prompt_ids))]
            for _ in range(profile.rollouts_per_step // group)
        ]
        batch = [p for p in chosen for _ in range(group)]  # each prompt's group together
        step_seed = (profile.seed * 100_003 + step) * profile.rollouts_per_step
        rollouts = rollout(self.client, self.job_id, batch, {**self.params, "seed": step_seed})
        t_gen = time.time()
        rewards = None
        if self.reward is not None:
            rewards = [
                self.reward.score(self.tokenizer.decode(r.completion_ids, skip_special_tokens=True))
                for r in rollouts
            ]
        scored = teacher_lib.score(self.client, self.job_id, self.teacher, rollouts, self.pad_id)
        mask, behaviour = scored.loss_mask, scored.old_log_probs_shifted
        reverse_kl = teacher_lib.reverse_kl_on_samples(
            behaviour, scored.teacher_log_probs_shifted, mask
        )
        kls = per_row_kl(scored)
        for g in range(len(chosen)):
            rows = range(g * group, (g + 1) * group)
            self.written.write_group(
                step=step, group=g, policy_version=driver.sampling_version(step),
                rollouts=[rollouts[i] for i in rows],
                rewards=None if rewards is None else [rewards[i] for i in rows],
                extras=[{"teacher_reverse_kl": kls[i]} for i in rows],
            )  # fmt: skip
        advantages = step_advantages(scored, rewards, group, profile.loss_config())
        frame = frames.opd_frame(scored, advantages, profile.loss_config())
        result, _ = self.trainer.train_step(frame)
        self.trainer.sync()  # to the student sampler only; the teacher stays frozen
        m = result["metrics"]
        record = {
            "teacher_reverse_kl": reverse_kl,
            "teacher_term_token_count": m.get("teacher_term_token_count", 0.0),
            "teacher_clipped_fraction": m.get("teacher_clipped_fraction", 0.0),
            "teacher_advantage_sum": m.get("teacher_advantage_sum", 0.0),
            "sampled_tokens": int(mask.sum()),
            "loss": result["avg_loss"],
            "clip_ratio": m.get("clip_ratio"),
            "mismatch_kl/mean": m.get("approx_kl"),
            "time/rollouts": round(t_gen - t0, 3),
        }
        if rewards is not None:
            record["reward/mean"] = sum(rewards) / len(rewards)
        return record

    def evaluate(self, step: int) -> dict:
        self.evals.append({"step": step, **self.held_out()})
        keys = {"eval/teacher_reverse_kl": self.evals[-1]["teacher_reverse_kl"]}
        if self.reward is not None:
            keys["eval/accuracy"] = self.evals[-1]["accuracy"]
        self.fingerprints.append(self.fingerprint())
        _check_frozen(self.fingerprints, f"at step {step}")
        log.info("eval at step %d: %s", step, _eval_line(self.evals[-1]))
        return keys

    def state(self) -> dict:
        return {
            "rng": self.rng.getstate(),
            "evals": self.evals,
            "teacher_fingerprints": self.fingerprints,
        }

    def finish(self, client) -> dict:
        self.fingerprints.append(self.fingerprint())
        _check_frozen(self.fingerprints, "at the end")
        saved = self.trainer.save_weights(self.steps)
        client.cancel_job(self.job_id)
        history, evals, has_reward = self.run.read_metrics(), self.evals, self.reward is not None
        return {
            "steps": self.steps,
            "teacher_tau": self.profile.teacher_tau,
            "teacher": self.teacher_source or {"model": self.profile.teacher_model},
            "teacher_reverse_kl": [h["teacher_reverse_kl"] for h in history],
            "rewards": [h["reward/mean"] for h in history] if has_reward else None,
            "eval_steps": [e["step"] for e in evals],
            "eval_teacher_reverse_kl": [e["teacher_reverse_kl"] for e in evals],
            "eval_accuracy": [e["accuracy"] for e in evals] if has_reward else None,
            "eval_items": {"first": evals[0]["items"], "last": evals[-1]["items"]},
            "eval_examples": {"first": evals[0].get("examples"), "last": evals[-1].get("examples")},
            "eval_prompts": len(self.eval_ids),
            "teacher_tokens": [h["teacher_term_token_count"] for h in history],
            "losses": [h["loss"] for h in history],
            "teacher_fingerprint": self.fingerprints[0],
            # at the start, every eval, any resume, the end
            "teacher_fingerprints": self.fingerprints,
            "teacher_frozen": len(set(self.fingerprints)) == 1,
            "alignment": self.alignment,
            "checkpoint_id": saved["checkpoint_id"],
        }

    def fingerprint(self) -> str:
        return teacher_fingerprint(self.client, self.job_id, self.teacher, self.prompt_ids[0])

    def held_out(self) -> dict:
        return evaluate(
            self.client, self.job_id, self.teacher, self.eval_ids, self.params, self.pad_id,
            self.tokenizer, self.reward,
        )  # fmt: skip


def main(config: Config) -> dict:
    driver.start_logging()
    profile = load_opd_profile(config.profile, config.overrides)
    steps = config.steps_for(profile)
    if profile.teacher_sft:  # fail before anything is trained or written
        teacher_sft.check(profile.teacher_sft, profile.teacher_model, config.connection)
    run = config.open_run("opd", profile)
    if run.finished:
        return run.finished
    run.prelaunch(config.connection)  # the local backend starts while the data loads
    algorithm = OPD(config, profile, run, steps)
    schedule = driver.Schedule(
        steps,
        eval_every=config.eval_interval or profile.eval_interval,
        ckpt_every=config.ckpt_interval,
    )
    return driver.drive(run, config.connection, algorithm, schedule, profile_name=profile.name)


def _eval_line(result: dict) -> str:
    line = f"teacher reverse KL {result['teacher_reverse_kl']:.3f} (per-token estimate)"
    if "accuracy" in result:
        line += f", task accuracy {result['accuracy']:.3f}"
    return line


def _check_frozen(fingerprints: list[str], where: str) -> None:
    """Stop the run when the teacher's scores on the probe changed (it must stay frozen)."""
    if len(set(fingerprints)) > 1:
        raise RuntimeError(
            f"the teacher's scores on the probe changed {where} (fingerprints {fingerprints}); "
            "the teacher must stay frozen, so nothing after this point is trained"
        )


def _rng_state(saved: list) -> tuple:
    """``random.Random.getstate()`` back from its JSON form (lists for tuples)."""
    version, internal, gauss = saved
    return version, tuple(internal), gauss


KL_NOTE = (
    "teacher reverse KL: a per-token estimate on the student's own samples (the mean of "
    "log p_student - log p_teacher over sampled tokens); one batch's value can be below 0"
)


def summary_line(out: dict) -> str:
    """The result as one JSON line, then what the numbers mean and the run's next steps."""
    keys = ("profile", "eval_teacher_reverse_kl", "eval_accuracy", "wall_time_s")
    if "profile" not in out:  # stopped before its end (stop_after): it says how to go on
        return json.dumps(out)
    lines = [json.dumps({k: out.get(k) for k in keys})]
    teacher = out.get("teacher") or {}
    if teacher.get("sft_run_dir"):
        lines.append(f"teacher: the SFT run in {teacher['sft_run_dir']}, merged into "
                     f"{teacher.get('model')}")  # fmt: skip
    lines.append(KL_NOTE)
    return "\n".join([*lines, *driver.next_steps(out["run_dir"], export_extra="opd")])


if __name__ == "__main__":
    sys.exit(command_line(Config, OPDProfile, main, summary_line))
