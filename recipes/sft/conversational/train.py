"""Conversational SFT on the ``causal_cross_entropy`` path.

    python -m recipes.sft.conversational.train profile=recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json

Reads top to bottom as the algorithm: load the profile and data, render conversations into
token ids with per-token weights, greedy-evaluate the base model, train (forward-backward with
``causal_cross_entropy`` + step), save weights-only, reload that checkpoint into a fresh
sampling sub-job and evaluate again. ``connection=local`` (default) runs against the embedded
local backend; ``connection=<file.json>`` against a Cortex endpoint. The run lives in
``runs/sft/<run_name>/`` (cortex_recipes.run); rerunning the command resumes it.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import chz

from cortex_recipes import payloads, profiles, sft
from cortex_recipes.models import load_tokenizer
from cortex_recipes.run import RunConfig, Trainer, profile_field
from cortex_recipes.sampling import greedy_answers
from cortex_recipes.supervision import collate, make_renderer, render_supervised

log = logging.getLogger("recipes.sft.conversational")
DEFAULT_PROFILE = "recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json"


@chz.chz
class Config(RunConfig):
    profile: str = profile_field(DEFAULT_PROFILE)
    steps: int = chz.field(default=0, doc="0: the profile's steps")
    ckpt_interval: int = chz.field(
        default=0, doc="> 0: a resumable save every this many steps (a resume point)"
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
    examples = [
        render_supervised(messages, tokenizer, renderer, profile.train_on_what)
        for messages in profile.conversations()
    ]
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    frame = payloads.legacy_labels_frame if config.legacy_labels else payloads.sft_frame
    state = run.resume or {"losses": [], "eval_before": None}
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
                    step, {"losses": losses, "eval_before": state["eval_before"]}
                )
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

    summary.update(
        losses=losses,
        final_loss=losses[-1],
        checkpoint_id=saved["checkpoint_id"],
        resumed_from_step=run.resumed_from_step,
        wall_time_s=round(time.time() - started, 1),
    )
    return run.summary(summary)


if __name__ == "__main__":
    result = main(profiles.entrypoint(Config, sft.SFTProfile))
    print(
        json.dumps(
            {k: result[k] for k in ("profile", "final_loss", "wall_time_s", "checkpoint_id")}
        )
    )
    sys.exit(0)
