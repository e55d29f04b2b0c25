"""On-policy distillation: the student trains on its own rollouts, scored by a frozen teacher.

    python -m recipes.distillation.on_policy.train profile=recipes/distillation/on_policy/configs/local-cpu-smollm2-teacher.json

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

from cortex_recipes import completions, frames, profiles, progress
from cortex_recipes.distill import teacher as teacher_lib
from cortex_recipes.distill.profile import OPDProfile, load_opd_profile
from cortex_recipes.models import load_tokenizer
from cortex_recipes.rollouts import Rollout, rollouts_from_results
from cortex_recipes.run import RunConfig, Trainer, profile_field
from cortex_recipes.sampling import chat_prompt_ids, generate

log = logging.getLogger("recipes.distillation.on_policy")
DEFAULT_PROFILE = "recipes/distillation/on_policy/configs/local-cpu-smollm2-teacher.json"


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    steps: int = chz.field(default=0, doc="0: the profile's steps")
    rollouts_rate: float = completions.rate_field()
    ckpt_interval: int = chz.field(
        default=0, doc="> 0: a resumable save every this many steps (a resume point)"
    )


def teacher_fingerprint(client, job_id: str, teacher_id: str, probe: list[int]) -> str:
    """Hash of the teacher's logprobs on a fixed probe: equal at start and end => teacher frozen."""
    response = client.forward(
        job_id, frames.teacher_frame(torch.tensor([probe])), sub_job_id=teacher_id
    )
    logprobs = client.poll_request(job_id, response["request_id"])["post_process_outputs"][
        "logprobs"
    ]
    return hashlib.sha256(logprobs.float().numpy().tobytes()).hexdigest()[:16]


def rollout(client, job_id: str, prompts: list[list[int]], params: dict) -> list[Rollout]:
    return rollouts_from_results(
        prompts, generate(client, job_id, prompts, {**params, "logprobs": 0})
    )


def eval_reverse_kl(
    client, job_id: str, teacher: str, prompts: list[list[int]], params: dict, pad_id: int
) -> float:
    """Teacher reverse KL on a fixed prompt set with a fixed sampling seed: comparable across steps."""
    with progress.task(f"eval: teacher reverse KL on {len(prompts)} prompts"):
        rollouts = rollout(client, job_id, prompts, {**params, "seed": 12345})
        batch = teacher_lib.score(client, job_id, teacher, rollouts, pad_id)
    return teacher_lib.reverse_kl_on_samples(
        batch.old_log_probs_shifted, batch.teacher_log_probs_shifted, batch.loss_mask
    )


def main(config: Config) -> dict:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    profile = load_opd_profile(config.profile, config.overrides)
    steps = config.steps or profile.steps
    run = config.open_run("opd", profile)
    if run.finished:
        return run.finished

    student_tok = load_tokenizer(profile.student_model)
    teacher_lib.check_same_tokenizer(student_tok, load_tokenizer(profile.teacher_model))
    prompts = profile.prompt_texts()
    prompt_ids = [chat_prompt_ids(student_tok, p) for p in prompts]
    pad_id = frames.pad_id(student_tok)
    rng = random.Random(profile.seed)
    written = completions.RolloutWriter(run.path, student_tok, rate=config.rollouts_rate)
    started = time.time()
    params = {"max_tokens": profile.max_tokens, "temperature": profile.temperature}

    with run.connect(config.connection) as client:
        trainer = Trainer.start(
            client, profile.sub_jobs(), run, weight_format=profile.weight_format
        )
        job_id, teacher = trainer.job_id, trainer.sub_jobs["log_probability"]
        fingerprints = [teacher_fingerprint(client, job_id, teacher, prompt_ids[0])]
        if run.resume:
            trainer.load(run.resume)  # and sync: the student sampler serves the resumed policy
            rng.setstate(_rng_state(run.resume["rng"]))
            eval_kls = run.resume["eval_kls"]
            fingerprints = [*run.resume["teacher_fingerprints"], *fingerprints]
            _check_frozen(fingerprints, "at the resume")
        # The trainer and the student sampler hold the same weights here, so scoring the
        # sampler's own completions on the trainer through the teacher path must give back the
        # sampler's logprobs: proof that teacher scores land on the tokens they score.
        probe = rollout(
            client, job_id, prompt_ids[:2],
            {"max_tokens": profile.max_tokens, "temperature": 1.0, "seed": 424242},
        )  # fmt: skip
        alignment = teacher_lib.check_alignment(
            client, job_id, trainer.sub_jobs["training"], probe, pad_id,
            profile.alignment_tolerance,
        )  # fmt: skip
        log.info(
            "alignment probe: %d tokens, forward vs sampler logprobs mean |diff| %.2e (max %.2e)",
            alignment["positions"], alignment["mean_abs_diff"], alignment["max_abs_diff"],
        )  # fmt: skip
        if not run.resume:
            eval_kls = [eval_reverse_kl(client, job_id, teacher, prompt_ids, params, pad_id)]
            log.info("eval teacher reverse KL before training %.3f", eval_kls[0])

        run.track_steps(steps)
        for step in range((run.resumed_from_step or 0) + 1, steps + 1):
            t0 = time.time()
            batch = [
                prompt_ids[rng.randrange(len(prompt_ids))] for _ in range(profile.rollouts_per_step)
            ]
            step_seed = profile.seed * 100_003 + step
            rollouts = rollout(client, job_id, batch, {**params, "seed": step_seed})
            t_gen = time.time()
            scored = teacher_lib.score(client, job_id, teacher, rollouts, pad_id)
            mask, behaviour = scored.loss_mask, scored.old_log_probs_shifted
            teacher_scores = scored.teacher_log_probs_shifted
            reverse_kl = teacher_lib.reverse_kl_on_samples(behaviour, teacher_scores, mask)
            baseline = teacher_lib.teacher_baseline(
                behaviour, teacher_scores, mask, profile.grpo_config()
            )
            for i, sampled in enumerate(rollouts):  # one sample a group; no reward: the teacher
                if written.keeps(step, i):
                    kl = teacher_lib.reverse_kl_on_samples(
                        behaviour[i : i + 1], teacher_scores[i : i + 1], mask[i : i + 1]
                    )
                    written.write_group(
                        step=step, group=i, policy_version=step - 1, rollouts=[sampled],
                        extras=[{"teacher_reverse_kl": kl}],
                    )  # fmt: skip
            frame = frames.opd_frame(scored, baseline, profile.grpo_config())
            result, _ = trainer.train_step(frame)
            trainer.sync()  # to the student sampler only; the teacher stays frozen
            m = result["metrics"]
            record = {
                "step": step,
                "teacher_reverse_kl": reverse_kl,
                "teacher_term_token_count": m.get("teacher_term_token_count", 0.0),
                "teacher_clipped_fraction": m.get("teacher_clipped_fraction", 0.0),
                "teacher_advantage_sum": m.get("teacher_advantage_sum", 0.0),
                "sampled_tokens": int(mask.sum()),
                "loss": result["avg_loss"],
                "clip_ratio": m.get("clip_ratio"),
                "mismatch_kl/mean": m.get("approx_kl"),
                "time/rollouts": round(t_gen - t0, 3),
                "time/step": round(time.time() - t0, 3),
            }
            if step % 5 == 0 or step == steps:
                eval_kls.append(
                    eval_reverse_kl(client, job_id, teacher, prompt_ids, params, pad_id)
                )
                record["eval/teacher_reverse_kl"] = eval_kls[-1]
                fingerprints.append(teacher_fingerprint(client, job_id, teacher, prompt_ids[0]))
                _check_frozen(fingerprints, f"at step {step}")
            run.metrics(**record)
            if config.ckpt_interval and step % config.ckpt_interval == 0 and step < steps:
                trainer.save_resumable(
                    step,
                    {"rng": rng.getstate(), "eval_kls": eval_kls,
                     "teacher_fingerprints": fingerprints},
                )  # fmt: skip
            log.info(
                "step %d/%d teacher reverse KL %.3f teacher tokens %d",
                step,
                steps,
                reverse_kl,
                record["teacher_term_token_count"],
            )

        fingerprints.append(teacher_fingerprint(client, job_id, teacher, prompt_ids[0]))
        _check_frozen(fingerprints, "at the end")
        saved = trainer.save_weights(steps)
        client.cancel_job(job_id)

    history = run.read_metrics()
    kls = [h["teacher_reverse_kl"] for h in history]
    summary = {
        "profile": profile.name,
        "config_hash": profile.config_hash,
        "steps": steps,
        "teacher_reverse_kl": kls,
        "eval_teacher_reverse_kl": eval_kls,
        "teacher_tokens": [h["teacher_term_token_count"] for h in history],
        "losses": [h["loss"] for h in history],
        "teacher_fingerprint": fingerprints[0],
        "teacher_fingerprints": fingerprints,  # at the start, every eval, any resume, the end
        "teacher_frozen": len(set(fingerprints)) == 1,
        "alignment": alignment,
        "checkpoint_id": saved["checkpoint_id"],
        "resumed_from_step": run.resumed_from_step,
        "wall_time_s": round(time.time() - started, 1),
    }
    return run.summary(summary)


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


if __name__ == "__main__":
    out = main(profiles.entrypoint(Config, OPDProfile))
    print(json.dumps({k: out[k] for k in ("profile", "eval_teacher_reverse_kl", "wall_time_s")}))
    sys.exit(0)
