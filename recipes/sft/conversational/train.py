"""Conversational SFT on the ``causal_cross_entropy`` path.

    python -m recipes.sft.conversational.train profile=recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json

Reads top to bottom as the algorithm: load the profile and data, render conversations into
token ids with per-token weights, greedy-evaluate the base model, train (forward-backward with
``causal_cross_entropy`` + step), save weights-only, reload that checkpoint into a fresh
sampling sub-job and evaluate again. ``connection=local`` (default) runs against the embedded
local backend; ``connection=<file.json>`` against a Cortex endpoint.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import chz

from cortex_recipes import payloads, sft
from cortex_recipes.endpoint import connect
from cortex_recipes.models import load_tokenizer
from cortex_recipes.qualify import git_revision
from cortex_recipes.run_log import RunLog
from cortex_recipes.sampling import greedy_answers
from cortex_recipes.supervision import collate, make_renderer, render_supervised

log = logging.getLogger("recipes.sft.conversational")
DEFAULT_PROFILE = "recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json"


@chz.chz
class Config:
    profile: str = DEFAULT_PROFILE
    connection: str = "local"
    log_path: str = ""  # default: runs/sft/<profile name>
    steps: int = 0  # 0: the profile's steps
    legacy_labels: bool = False  # compatibility only: model-side loss from labels (no weights)


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
    profile = sft.load_profile(config.profile)
    steps = config.steps or profile.steps
    run = RunLog(
        Path(config.log_path or f"runs/sft/{profile.name}"),
        config=chz.asdict(config),
        profile=profile.raw,
    )

    tokenizer = load_tokenizer(profile.model_name)
    renderer = make_renderer(tokenizer, profile.renderer)
    examples = [
        render_supervised(messages, tokenizer, renderer, profile.train_on)
        for messages in sft.load_conversations(profile.dataset)
    ]
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    frame = payloads.legacy_labels_frame if config.legacy_labels else payloads.sft_frame
    summary: dict = {"profile": profile.name, "config_hash": profile.config_hash, "steps": steps}
    started = time.time()

    with connect(config.connection) as client:
        if profile.eval:
            job_id = client.create_job([profile.sampling_sub_job()])
            client.wait_for_job(job_id)
            summary["eval_before"] = evaluate(client, profile, tokenizer, job_id)
            client.cancel_job(job_id)

        job_id = client.create_job([profile.training_sub_job()])
        client.wait_for_job(job_id)
        losses = []
        for step, indices in enumerate(
            sft.batches(len(examples), profile.batch_size, steps, profile.seed), start=1
        ):
            t0 = time.time()
            batch = collate(
                [examples[i] for i in indices], pad_id=pad_id, max_seq_len=profile.max_seq_len
            )
            result = client.poll_request(job_id, client.forward_backward(job_id, frame(batch)))
            stepped = client.poll_request(job_id, client.step(job_id))
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
                time_s=round(time.time() - t0, 3),
            )
            log.info("step %d/%d loss %.4f", step, steps, result["avg_loss"])
        saved = client.poll_request(job_id, client.save(job_id, checkpoint_type="weights-only"))
        run.checkpoint(
            step=steps, **{k: saved[k] for k in ("checkpoint_id", "stage_path", "checkpoint_type")}
        )
        client.cancel_job(job_id)

        if profile.eval:
            source = {"checkpoint_id": saved["checkpoint_id"], "source_job_id": job_id}
            eval_job = client.create_job([profile.sampling_sub_job(source_checkpoint_info=source)])
            client.wait_for_job(eval_job)
            summary["eval_after"] = evaluate(client, profile, tokenizer, eval_job)
            client.cancel_job(eval_job)

    summary.update(
        losses=losses,
        final_loss=losses[-1],
        checkpoint_id=saved["checkpoint_id"],
        wall_time_s=round(time.time() - started, 1),
        git_revision=git_revision(),
    )
    run.summary(summary)
    return summary


if __name__ == "__main__":
    result = main(chz.entrypoint(Config))
    print(
        json.dumps(
            {k: result[k] for k in ("profile", "final_loss", "wall_time_s", "checkpoint_id")}
        )
    )
    sys.exit(0)
