"""Conversational SFT on the ``causal_cross_entropy`` path.

    python -m recipes.sft.conversational.train       # SmolLM2-135M LoRA learns an identity answer
    python -m recipes.sft.conversational.train profile=recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json

Reads top to bottom as the algorithm: load the profile and data, render conversations into
token ids with per-token weights, greedy-evaluate the base model, train (forward-backward with
``causal_cross_entropy`` + step), save weights-only, reload that checkpoint into a fresh
sampling sub-job and evaluate again. A profile with ``eval.weight_comparison`` also scores
the held-out log-likelihood of its full-weight and down-weighted answers with the trainer's
``forward`` before the first step and after the last (cortex_recipes.loglik).
``connection=local`` (default) runs against the embedded local backend;
``connection=<file.json>`` against a Cortex endpoint. The run lives in
``runs/sft/<run_name>/`` (cortex_recipes.run); rerunning the command resumes it.
"""

from __future__ import annotations

import logging
import sys
import time

import chz

from cortex_recipes import frames, loglik, profiles, sft
from cortex_recipes.models import load_tokenizer
from cortex_recipes.run import RunConfig, profile_field
from cortex_recipes.sampling import greedy_answers
from cortex_recipes.supervision import collate, make_renderer, render_supervised
from cortex_recipes.training_job import Trainer

log = logging.getLogger("recipes.sft.conversational")
# The default shows learning on a CPU (about 70 s of training on 2 cores); the smoke command
# names the tiny profile.
DEFAULT_PROFILE = "recipes/sft/conversational/configs/local-cpu-smollm2-lora.json"


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    steps: int = chz.field(
        validator=profiles.at_least(0, "0: the profile's steps"),
        default=0,
        doc="0: the profile's steps",
    )
    ckpt_interval: int = chz.field(
        validator=profiles.at_least(0, "0: none"),
        default=0,
        doc="> 0: a resumable save every this many steps (a resume point)",
    )
    legacy_labels: bool = chz.field(
        default=False, doc="compatibility only: model-side loss from labels (no weights)"
    )


def evaluate(client, profile: sft.SFTProfile, tokenizer, job_id: str) -> dict:
    spec = profile.eval
    prompts = spec.prompts + [c["prompt"] for c in spec.controls]
    answers = greedy_answers(client, job_id, tokenizer, prompts, max_tokens=spec.max_tokens)
    held_out = answers[: len(spec.prompts)]
    controls = [
        {**c, "answer": a, "ok": c["expect"] in a}
        for c, a in zip(spec.controls, answers[len(spec.prompts) :], strict=True)
    ]
    hits = sum(spec.expect in a for a in held_out)
    return {
        "held_out": [
            {"prompt": p, "answer": a} for p, a in zip(spec.prompts, held_out, strict=True)
        ],
        "held_out_hits": hits,
        "held_out_total": len(held_out),
        "controls": controls,
    }


def main(config: Config) -> dict:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    profile = sft.load_profile(config.profile, config.overrides)
    steps = config.steps or profile.steps
    run = config.open_run("sft", profile)
    if run.finished:
        return run.finished

    tokenizer = load_tokenizer(profile.model_name)
    renderer = make_renderer(tokenizer, profile.renderer)
    conversations = profile.conversations()
    comparison = profile.eval.weight_comparison if profile.eval else None
    if comparison:
        comparison.check_data(conversations)
    examples = [
        render_supervised(messages, tokenizer, renderer, profile.train_on_what)
        for messages in conversations
    ]
    pad_id = frames.pad_id(tokenizer)
    frame = frames.legacy_labels_frame if config.legacy_labels else frames.sft_frame
    state = run.resume or {"losses": [], "eval_before": None, "loglik_before": None}
    losses = state["losses"]
    started = time.time()

    with run.connect(config.connection) as client:
        if profile.eval and state["eval_before"] is None:
            job_id = client.create_job([profile.sampling_sub_job()])
            client.wait_for_job(job_id)
            state["eval_before"] = evaluate(client, profile, tokenizer, job_id)
            client.cancel_job(job_id)

        trainer = Trainer.start(client, [profile.training_sub_job()], run)
        if run.resume:
            trainer.load(run.resume)
        run.track_steps(steps)

        def score() -> dict:
            return loglik.score_comparison(
                client, trainer.job_id, trainer.sub_jobs["training"], tokenizer, renderer,
                comparison,
            )  # fmt: skip

        if comparison and state.get("loglik_before") is None:
            state["loglik_before"] = score()  # the trainer before its first step
        for step, indices in enumerate(
            sft.batches(len(examples), profile.batch_size, steps, profile.seed), start=1
        ):
            if step <= len(losses):
                continue  # trained before the checkpoint this run resumed from
            t0 = time.time()
            batch = collate(
                [examples[i] for i in indices], pad_id=pad_id, max_seq_len=profile.max_seq_len
            )
            result, stepped = trainer.train_step(frame(batch))
            losses.append(result["avg_loss"])
            run.metrics(
                step=step,
                loss=result["avg_loss"],
                supervised_tokens=int((batch.loss_mask > 0).sum()),
                loss_weight_sum=float(batch.loss_mask.sum()),
                dropped_examples=batch.n_dropped,
                truncated_examples=batch.n_truncated,
                grad_norm=stepped.get("grad_norm"),
                lr=stepped.get("last_lr"),
                **{"time/step": round(time.time() - t0, 3)},
            )
            log.info("step %d/%d loss %.4f", step, steps, result["avg_loss"])
            if config.ckpt_interval and step % config.ckpt_interval == 0 and step < steps:
                trainer.save_resumable(
                    step,
                    {
                        "losses": losses,
                        "eval_before": state["eval_before"],
                        "loglik_before": state.get("loglik_before"),
                    },
                )
        loglik_after = score() if comparison else None
        saved = trainer.save_weights(steps)
        client.cancel_job(trainer.job_id)

        summary: dict = {
            "profile": profile.name,
            "config_hash": profile.config_hash,
            "steps": steps,
        }
        if profile.eval:
            summary["eval_before"] = state["eval_before"]
            source = {"checkpoint_id": saved["checkpoint_id"], "source_job_id": trainer.job_id}
            eval_job = client.create_job([profile.sampling_sub_job(source_checkpoint_info=source)])
            client.wait_for_job(eval_job)
            summary["eval_after"] = evaluate(client, profile, tokenizer, eval_job)
            client.cancel_job(eval_job)
        if comparison:
            compared = loglik.compare_weights(
                state["loglik_before"],
                loglik_after,
                full_weight=comparison.full.weight,
                down_weight=comparison.down.weight,
            )
            summary["weight_comparison"] = compared
            diff = compared["gain_difference"]
            log.info(
                "held-out log-likelihood gain: full %.3f, down-weighted %.3f, "
                "difference %.3f [%.3f, %.3f]",
                compared["full_gain"]["value"], compared["down_gain"]["value"],
                diff["value"], diff["low"], diff["high"],
            )  # fmt: skip

    summary.update(
        losses=losses,
        final_loss=losses[-1],
        checkpoint_id=saved["checkpoint_id"],
        resumed_from_step=run.resumed_from_step,
        wall_time_s=round(time.time() - started, 1),
    )
    return run.summary(summary)


def report(result: dict) -> str:
    """What a person reads at the end of a run: the answers before and after, the control,
    where the run lives and how to export or resume it."""
    lines = [
        f"{result['profile']}: {result['steps']} steps, loss {result['losses'][0]:.3f} -> "
        f"{result['final_loss']:.3f}, {result['wall_time_s']} s"
    ]
    before, after = result.get("eval_before"), result.get("eval_after")
    if before and after:
        lines.append(
            f"held-out answers (expecting the trained identity): "
            f"{before['held_out_hits']}/{before['held_out_total']} before, "
            f"{after['held_out_hits']}/{after['held_out_total']} after"
        )
        for b, a in zip(before["held_out"], after["held_out"], strict=True):
            lines += [f"  Q: {b['prompt']}", f"     before: {b['answer']!r}"]
            lines.append(f"     after:  {a['answer']!r}")
        for b, a in zip(before["controls"], after["controls"], strict=True):
            kept = "kept" if a["ok"] else "LOST"
            lines += [f"  control ({kept}): {b['prompt']}", f"     before: {b['answer']!r}"]
            lines.append(f"     after:  {a['answer']!r}")
    run_dir = result["run_dir"]
    lines += [
        f"run directory: {run_dir} (metrics.jsonl, summary.json, debug.log)",
        f"export it: python3 -m uv run --frozen --extra sft cortex-recipes export {run_dir} "
        "<out dir>   (a from_pretrained / PEFT directory)",
        "rerun the same command to resume it (or return it when finished); "
        "if_exists=overwrite trains again",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(profiles.command_line(Config, sft.SFTProfile, main, report))
