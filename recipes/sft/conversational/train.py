"""Conversational SFT on the ``causal_cross_entropy`` path.

    python -m recipes.sft.conversational.train       # SmolLM2-135M LoRA learns an identity answer
    python -m recipes.sft.conversational.train profile=recipes/sft/conversational/configs/local-cpu-tiny-qwen3.json

Reads top to bottom as the algorithm: load the profile and data, render conversations into
token ids with per-token weights, start one job (the trainer and, with an eval, a sampler),
greedy-evaluate the base model on the sampler, train (forward-backward with
``causal_cross_entropy`` + step), save weights-only, sync the trained weights onto the sampler
and evaluate again. A profile with ``eval.weight_comparison`` also scores
the held-out log-likelihood of its full-weight and down-weighted answers with the trainer's
``forward`` before the first step and after the last (cortex_recipes.loglik).
``connection=local`` (default) runs against the embedded local backend;
``connection=<file.json>`` against a Cortex endpoint. The run lives in
``runs/sft/<run_name>/`` (cortex_recipes.run); rerunning the command resumes it.
"""

from __future__ import annotations

import logging
import sys

import chz

from cortex_recipes import driver, frames, loglik, profiles, progress, sft
from cortex_recipes.models import load_tokenizer
from cortex_recipes.run import RunConfig, command_line, profile_field
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
    ckpt_interval: int = profiles.count_field(
        "> 0: a resumable save every this many steps (a resume point)", meaning="0: none"
    )
    legacy_labels: bool = chz.field(
        default=False, doc="compatibility only: model-side loss from labels (no weights)"
    )


def evaluate(client, profile: sft.SFTProfile, tokenizer, job_id: str) -> dict:
    spec = profile.eval
    prompts = spec.prompts + [c["prompt"] for c in spec.controls]
    with progress.task(f"eval: {len(prompts)} greedy answers"):
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


class SFT:
    """The SFT algorithm for :func:`cortex_recipes.driver.drive`: greedy answers before
    training (on the base model, on the job's sampler), optionally the held-out
    log-likelihood of the weight comparison's answers on the trainer, one weighted
    ``causal_cross_entropy`` step a batch, then a weights-only save and the answers again once
    the trained weights are synced onto the sampler."""

    log_keys = (("loss", ".4f"),)

    def __init__(self, config: Config, profile: sft.SFTProfile, steps: int):
        self.profile, self.steps = profile, steps
        self.tokenizer = load_tokenizer(profile.model)
        self.renderer = make_renderer(self.tokenizer, profile.renderer)
        conversations = profile.conversations()
        self.comparison = profile.eval.weight_comparison if profile.eval else None
        if self.comparison:
            self.comparison.check_data(conversations)
        self.examples = [
            render_supervised(messages, self.tokenizer, self.renderer, profile.train_on_what)
            for messages in conversations
        ]
        self.pad_id = frames.pad_id(self.tokenizer)
        self.frame = frames.legacy_labels_frame if config.legacy_labels else frames.sft_frame
        self.batches = sft.batches(len(self.examples), profile.batch_size, steps, profile.seed)
        self.losses: list[float] = []
        self.eval_before: dict | None = None
        self.loglik_before: dict | None = None

    def start(self, client, run, stack) -> Trainer:
        self.client = client
        # One job: the trainer and (with an eval) the sampler that answers before and after, so
        # both workers start together and no model loads twice.
        sub_jobs = self.profile.sub_jobs()[: 2 if self.profile.eval else 1]
        self.trainer = Trainer.start(
            client, sub_jobs, run, weight_format=self.profile.weight_format
        )
        if self.profile.eval and self.eval_before is None and not run.resume:
            self.eval_before = self.answers()  # the base model: nothing synced yet
        return self.trainer

    def restore(self, state: dict) -> None:
        self.losses = state["losses"]
        self.eval_before, self.loglik_before = state["eval_before"], state.get("loglik_before")

    def begin(self) -> None:
        if self.comparison and self.loglik_before is None:
            self.loglik_before = self.score()  # the trainer before its first step

    def step(self, step: int) -> dict:
        batch = collate(
            [self.examples[i] for i in self.batches[step - 1]],
            pad_id=self.pad_id, max_seq_len=self.profile.max_seq_len,
        )  # fmt: skip
        result, stepped = self.trainer.train_step(self.frame(batch))
        self.losses.append(result["avg_loss"])
        return {
            "loss": result["avg_loss"],
            "supervised_tokens": int((batch.loss_mask > 0).sum()),
            "loss_weight_sum": float(batch.loss_mask.sum()),
            "dropped_examples": batch.n_dropped,
            "truncated_examples": batch.n_truncated,
            "grad_norm": stepped.get("grad_norm"),
            "lr": stepped.get("last_lr"),
        }

    def evaluate(self, step: int) -> dict:
        return {}  # the answers are compared before and after the run, in finish()

    def state(self) -> dict:
        return {
            "losses": self.losses,
            "eval_before": self.eval_before,
            "loglik_before": self.loglik_before,
        }

    def finish(self, client) -> dict:
        loglik_after = self.score() if self.comparison else None
        saved = self.trainer.save_weights(self.steps)
        summary: dict = {"steps": self.steps}
        if self.profile.eval:
            summary["eval_before"] = self.eval_before
            self.trainer.sync()  # the trained weights, as saved, onto the sampler
            summary["eval_after"] = self.answers()
        client.cancel_job(self.trainer.job_id)
        if self.comparison:
            summary["weight_comparison"] = self.compared(loglik_after)
        return {
            **summary,
            "losses": self.losses,
            "final_loss": self.losses[-1],
            "checkpoint_id": saved["checkpoint_id"],
        }

    def answers(self) -> dict:
        """The profile's greedy eval on the job's sampler (the base model, or the trained
        weights once synced)."""
        return evaluate(self.client, self.profile, self.tokenizer, self.trainer.job_id)

    def score(self) -> dict:
        return loglik.score_comparison(
            self.client, self.trainer.job_id, self.trainer.sub_jobs["training"], self.tokenizer,
            self.renderer, self.comparison,
        )  # fmt: skip

    def compared(self, loglik_after: dict) -> dict:
        compared = loglik.compare_weights(
            self.loglik_before, loglik_after,
            full_weight=self.comparison.full.weight, down_weight=self.comparison.down.weight,
        )  # fmt: skip
        diff = compared["gain_difference"]
        log.info(
            "held-out log-likelihood gain: full %.3f, down-weighted %.3f, "
            "difference %.3f [%.3f, %.3f]",
            compared["full_gain"]["value"], compared["down_gain"]["value"],
            diff["value"], diff["low"], diff["high"],
        )  # fmt: skip
        return compared


def main(config: Config) -> dict:
    driver.start_logging()
    profile = sft.load_profile(config.profile, config.overrides)
    steps = config.steps_for(profile)
    run = config.open_run("sft", profile)
    if run.finished:
        return run.finished
    run.prelaunch(config.connection)  # the local backend starts while the data loads
    schedule = driver.Schedule(steps, ckpt_every=config.ckpt_interval)
    return driver.drive(
        run, config.connection, SFT(config, profile, steps), schedule, profile_name=profile.name
    )


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
    return "\n".join([*lines, *driver.next_steps(result["run_dir"], export_extra="sft")])


if __name__ == "__main__":
    sys.exit(command_line(Config, sft.SFTProfile, main, report))
