"""The project's SFT and Math GRPO beside TRL's trainers, in one run on one machine: step
times, and end-to-end times split into phases, with both sides in the same precision.

    python3 -m uv run --frozen --all-extras python bench/trl_side_by_side.py --same-evals --repeat 3
    python3 -m uv run --frozen --all-extras python bench/trl_side_by_side.py --only sft --steps 4
    python3 -m uv run --frozen --all-extras python bench/trl_side_by_side.py --precision bf16 --same-evals
    python bench/trl_side_by_side.py --project-only --sft-profile P --grpo-profile Q   # no TRL

What is compared. Each side trains the same model (the profile's, loaded from the same offline
files), on the same rendered data or the same problems, with the same LoRA, learning rate,
batch and group sizes, sampling settings and seeds:

- **SFT**: ``recipes.sft.conversational`` (SDK -> HTTP -> the local backend's trainer worker,
  ``causal_cross_entropy``) against TRL's ``SFTTrainer`` in this process, fed the very token
  ids and masks the recipe renders (``completion_mask`` = the recipe's supervised tokens);
- **Math GRPO**: ``recipes.rl.math_grpo`` (sample through the backend's sampler, score, train,
  step, weight sync) against TRL's ``GRPOTrainer`` (``model.generate`` in this process, no
  vLLM) with reasoning-gym's scorer as its reward function.

The recipe runs in this process as shipped (its profile, its backend, the backend's own thread
allocation); TRL gets every core of the machine (``torch.set_num_threads``) and runs without
its default activation checkpointing (the recipe's trainer does not recompute activations
either) and without saving.

Precision (``--precision``, default ``fp32``). TRL's configs default to ``bf16=True`` (mixed
precision, on the CPU too) while the CPU profiles train in float32, so the precision is set on
both sides and checked while they run (the results in bench/results/cpu-2026-12-05 and
cpu-2026-12-06 predate this: TRL trained there with bf16 autocast against a float32 recipe):

- ``fp32``: the recipe runs its profile as shipped (``"dtype": "float32"``; the bench refuses a
  profile that says otherwise); TRL gets ``bf16=False, fp16=False`` and the model loaded in
  float32;
- ``bf16``: the recipe runs with the override ``dtype=bfloat16`` (its sub-jobs load the model in
  bfloat16; the local backend accepts that on the CPU); TRL loads the model in bfloat16 too and
  trains with ``bf16=True`` (autocast). The LoRA weights stay float32 on both sides (PEFT's
  default upcast).

Checked at run time, and written to the JSON as each side's ``precision``: for the recipe, the
dtype the backend reports for every sub-job it ran (its resolved dtype and the worker's own);
for TRL, ``args.bf16``/``args.fp16``, the accelerator's ``mixed_precision`` and the dtypes of
the model's frozen and trainable parameters. A mismatch stops the bench.

Evaluations (``--same-evals``). The recipe evaluates: SFT answers its held-out and control
prompts greedily before training (on the base model) and after (from the saved checkpoint);
Math GRPO answers its eval problems greedily before the first step, on every
``eval.interval``-th step and after the last. TRL evaluates nothing by default, so the
end-to-end totals then compare different work (the JSON says so). With ``--same-evals`` the
TRL side runs the same evaluations at the same points: the recipe's own functions
(``recipes.sft.conversational.train.evaluate``, ``cortex_recipes.rl.grpo.greedy_eval``) on the
recipe's prompts and eval set, scored the same way, with their two SDK calls (``generate``,
``poll_request``) answered by the TRL model in this process (greedy, prompts left-padded into
one batch, each row stopping after an end-of-sequence token, as the backend's sampler does;
under TRL's autocast). Both sides' scores are in the JSON (``evaluations``).

How each number is measured (``time.perf_counter``; the side's clock starts when the bench
calls the recipe's ``main`` or starts building the TRL side, after Python's imports):

- a step: the recipe's ``time/step`` record (metrics.jsonl); for TRL the time from a step's
  ``on_step_begin`` to its ``on_step_end``. The per-step median leaves step 1 out (allocator
  and cache warm-up); step 1 is reported as ``first_step_s``;
- ``total_s`` (end to end): the recipe's ``main`` from call to return (backend start to backend
  shut down); TRL from the start to ``trainer.train()`` returning (the evaluations included);
- the phase split of ``total_s`` (``phases``, from the side's spans, :func:`phase_split`):
  ``train_s`` the sum of the step times; ``eval_s`` the time spent in evaluations; ``save_s``
  the time spent in checkpoint saves; ``startup_s`` the time from the start to the first step's
  beginning, less the evaluations and saves before it (recipe: backend start, job creation and
  model loads; TRL: profile, data, model load and trainer construction, and ``train()``'s own
  set-up); ``other_s`` the rest (between steps, after the last one, shutting down).

The recipe's records carry no evaluation time and a save time only for resumable saves
(``time/save_ckpt`` in checkpoints.jsonl; reported beside as ``save_recorded_s``), so the
bench times the recipe's own methods while it runs, without changing what they do: the
algorithm's ``step`` (the first one's start ends start-up), its evaluations (SFT's ``answers``,
which creates a sampling job, loads the base model or the checkpoint, answers and cancels it,
and ``score``; Math GRPO's ``greedy``) and the trainer's saves (``save_weights``,
``save_resumable``). ``eval_generate_s`` is the part of ``eval_s`` spent answering (the
generation requests themselves, without SFT's job creation). For TRL the spans are the step
callbacks and the evaluations above; it saves nothing (``save_s`` is 0; the recipe's saves are
part of its work: SFT evaluates from its checkpoint, Math GRPO leaves a resume point).

On a small shared machine one pair of runs does not resolve a few percent (TRL's own step times
moved by up to 25% between runs here): ``--repeat N`` runs N pairs, alternating which side goes
first, and reports each pair and the median of the pairs' values (ratios with their range).
The JSON goes to ``bench/results/<machine>-<date>/trl_side_by_side_fair.json``
(``..._fair_bf16.json`` for bf16) or ``--out``, rewritten after every pair.

``--project-only`` runs only the recipes (on ``--sft-profile`` / ``--grpo-profile``, default
the CPU profiles above) and reports each run's phase split and their medians, without TRL: the
GPU check (``bench/gpu_check.py``, phase ``split``) runs it on the journeys' smoke profiles, so a
lent GPU machine reports the same start-up / evaluation / training / saving split.

Needs the ``bench`` extra (TRL), except with ``--project-only``; no journey imports TRL.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the recipes package

SFT_PROFILE = "recipes/sft/conversational/configs/local-cpu-smollm2-lora.json"
GRPO_PROFILE = "recipes/rl/math_grpo/configs/local-cpu-smollm2-lora.json"
#: --precision -> the profiles' dtype
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}
PHASES = ("startup_s", "eval_s", "train_s", "save_s", "other_s")
Span = tuple[str, float, float]  # (phase, start, end), seconds from the side's start


# -- timing: spans and the phase split ------------------------------------------------------


class Clock:
    """Spans of named phases, in seconds since :meth:`start` (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.spans: list[Span] = []

    def start(self) -> None:
        self.started, self.spans = time.perf_counter(), []

    def now(self) -> float:
        return time.perf_counter() - self.started

    def add(self, phase: str, start: float, end: float) -> None:
        self.spans.append((phase, start, end))

    def timed(self, phase: str, fn: Callable) -> Callable:
        """``fn``, recording a ``phase`` span for each call (a failed call too)."""

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = self.now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(phase, start, self.now())

        return timed

    def rounded(self) -> list[list]:
        return [[phase, round(start, 3), round(end, 3)] for phase, start, end in self.spans]


def span_total(spans: Sequence[Span], phase: str) -> float:
    return sum(end - start for name, start, end in spans if name == phase)


def phase_split(total_s: float, step_s: Sequence[float], spans: Sequence[Span]) -> dict:
    """``total_s`` in :data:`PHASES`: ``startup_s`` from the start to the first ``step`` span's
    beginning, less the ``eval`` and ``save`` spans that ended before it; ``eval_s`` and
    ``save_s`` all spans of those phases; ``train_s`` the sum of ``step_s``; ``other_s`` the
    rest. Spans of other phases (``eval_generate``, nested in ``eval``) are not counted."""
    begins = [start for phase, start, _ in spans if phase == "step"]
    if not begins:
        raise ValueError("no step span: the side trained no step")
    first = min(begins)
    before = sum(
        end - start for phase, start, end in spans if phase in ("eval", "save") and end <= first
    )
    parts = {
        "startup_s": first - before,
        "eval_s": span_total(spans, "eval"),
        "train_s": sum(step_s),
        "save_s": span_total(spans, "save"),
    }
    parts["other_s"] = total_s - sum(parts.values())
    return {key: round(value, 3) for key, value in parts.items()}


def warm_median(times: Sequence[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def side_times(step_s: Sequence[float], total_s: float, spans: Sequence[Span]) -> dict:
    """What :func:`compare` reads of a side: its step times, first step, total and phases."""
    return {
        "step_s": [round(t, 3) for t in step_s],
        "first_step_s": round(step_s[0], 3),
        "total_s": round(total_s, 1),
        "phases": phase_split(total_s, step_s, spans),
    }


def compare(ours: dict, trl: dict) -> dict:
    """One pair: each side's warm step median, first step, total and phases, and the ratios."""
    mine, theirs = warm_median(ours["step_s"]), warm_median(trl["step_s"])
    return {
        "project_step_median_s": round(mine, 3),
        "trl_step_median_s": round(theirs, 3),
        "ratio_project_over_trl": round(mine / theirs, 3),
        "project_first_step_s": ours["first_step_s"],
        "trl_first_step_s": trl["first_step_s"],
        "project_total_s": ours["total_s"],
        "trl_total_s": trl["total_s"],
        "wall_ratio_project_over_trl": round(ours["total_s"] / trl["total_s"], 3),
        "project_phases": ours["phases"],
        "trl_phases": trl["phases"],
        "project": ours,
        "trl": trl,
    }


MEDIANS = (
    "project_step_median_s", "trl_step_median_s", "ratio_project_over_trl",
    "project_first_step_s", "trl_first_step_s",
    "project_total_s", "trl_total_s", "wall_ratio_project_over_trl",
)  # fmt: skip
RANGED = ("ratio_project_over_trl", "wall_ratio_project_over_trl")


def summarise(pairs: Sequence[dict]) -> dict:
    """The median over the pairs of each of :data:`MEDIANS` and of each side's phases, the
    range of the two ratios, then every pair."""
    out: dict[str, Any] = {"pairs_run": len(pairs)}
    for key in MEDIANS:
        out[key] = round(statistics.median(pair[key] for pair in pairs), 3)
    for key in RANGED:
        values = [pair[key] for pair in pairs]
        out[key.replace("ratio", "ratio_range", 1)] = [min(values), max(values)]
    for side in ("project_phases", "trl_phases"):
        out[side] = {
            phase: round(statistics.median(pair[side][phase] for pair in pairs), 3)
            for phase in PHASES
        }
    return {**out, "pairs": list(pairs)}


PROJECT_MEDIANS = ("step_median_s", "first_step_s", "total_s")


def summarise_project(runs: Sequence[dict]) -> dict:
    """``--project-only``: the median over the runs of the recipe's warm step, first step, total
    and phases, then every run (no TRL side: the GPU check's end-to-end split)."""
    rows = [{**run, "step_median_s": warm_median(run["step_s"])} for run in runs]
    out: dict[str, Any] = {"runs": len(rows)}
    for key in PROJECT_MEDIANS:
        out[key] = round(statistics.median(row[key] for row in rows), 3)
    out["phases"] = {
        phase: round(statistics.median(row["phases"][phase] for row in rows), 3) for phase in PHASES
    }
    return {**out, "each": list(rows)}


def eval_summary(result: dict) -> dict:
    """The few numbers of one evaluation both sides report: Math GRPO's accuracy, or SFT's
    held-out hits and the controls it kept."""
    if "accuracy" in result:
        return {"accuracy": round(result["accuracy"], 4)}
    return {
        "held_out_hits": result["held_out_hits"],
        "held_out_total": result["held_out_total"],
        "controls_kept": sum(bool(c["ok"]) for c in result["controls"]),
    }


def until_stop(token_ids: Sequence[int], stops: set[int]) -> list[int]:
    """The generated ids up to and including the first stop id (what the backend returns)."""
    out = []
    for token in token_ids:
        out.append(int(token))
        if token in stops:
            break
    return out


# -- precision checks -----------------------------------------------------------------------


def backend_precision(jobs: Sequence[dict], dtype: str) -> dict:
    """The dtypes the local backend reported for the sub-jobs of ``jobs`` (its job
    descriptions: the dtype it resolved and, once the worker runs, the worker's own), once
    each; RuntimeError when there is none or one is not ``dtype``."""
    seen: list[dict] = []
    for job in jobs:
        for sub in job.get("sub_jobs") or []:
            entry = {
                "job_type": sub.get("job_type") or sub.get("sub_job_id"),
                "dtype": sub.get("dtype"),
                "worker_dtype": (sub.get("info") or {}).get("dtype"),
            }
            if entry not in seen:
                seen.append(entry)
    wrong = [e for e in seen if e["dtype"] != dtype or e["worker_dtype"] not in (None, dtype)]
    if not seen or wrong:
        raise RuntimeError(
            f"the recipe was to run in {dtype}; the backend reported {wrong or 'no sub-job'}"
        )
    return {"dtype": dtype, "sub_jobs": seen}


def trl_precision(trainer, dtype: str) -> dict:
    """What TRL trains in: its precision flags, the accelerator's mixed precision and the
    model's parameter dtypes; RuntimeError when they are not ``dtype``'s (``float32``: no
    mixed precision, every parameter float32; ``bfloat16``: ``bf16=True`` and bfloat16 frozen
    weights, the LoRA weights as PEFT keeps them)."""
    mixed = trainer.accelerator.mixed_precision
    mixed = str(getattr(mixed, "value", mixed))
    params = list(trainer.model.parameters())
    seen = {
        "dtype": dtype,
        "args_bf16": bool(trainer.args.bf16),
        "args_fp16": bool(trainer.args.fp16),
        "mixed_precision": mixed,
        "frozen_dtypes": sorted({_name(p.dtype) for p in params if not p.requires_grad}),
        "trainable_dtypes": sorted({_name(p.dtype) for p in params if p.requires_grad}),
    }
    bf16 = dtype == "bfloat16"
    expected = {
        "args_bf16": bf16,
        "args_fp16": False,
        "mixed_precision": "bf16" if bf16 else "no",
        "frozen_dtypes": [dtype],
    }
    if not bf16:
        expected["trainable_dtypes"] = ["float32"]
    wrong = {key: seen[key] for key, value in expected.items() if seen[key] != value}
    if wrong:
        raise RuntimeError(f"TRL was to train in {dtype} ({expected}); it has {wrong}")
    return seen


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- the recipe side ------------------------------------------------------------------------


class Recipe(NamedTuple):
    """A recipe as the bench runs it: its train module, profile and algorithm class, the
    algorithm's methods that evaluate, the module's functions inside them that only generate,
    and the per-step series copied from its records (output key, record key, digits)."""

    module: str
    profile: str
    algorithm: str
    eval_methods: tuple[str, ...]
    generate_functions: tuple[str, ...]
    series: tuple[tuple[str, str, int], ...]


RECIPES = {
    "sft": Recipe(
        "recipes.sft.conversational.train", SFT_PROFILE, "SFT",
        ("answers", "score"), ("evaluate",), (("losses", "loss", 4),),
    ),
    "math_grpo": Recipe(
        "recipes.rl.math_grpo.train", GRPO_PROFILE, "MathGRPO",
        ("greedy",), ("greedy_eval",),
        (("rollouts_s", "time/rollouts", 3), ("train_s", "time/train", 3),
         ("rewards", "reward/mean", 3)),
    ),
}  # fmt: skip


def overrides_for(precision: str) -> tuple[str, ...]:
    """The profile overrides of ``precision``: none for fp32 (the profile as shipped)."""
    return () if precision == "fp32" else (f"dtype={PRECISIONS[precision]}",)


@contextlib.contextmanager
def patched(replacements: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set each ``(owner, name, value)`` for the block, then put back what was there."""
    missing = object()
    saved = [(owner, name, vars(owner).get(name, missing)) for owner, name, _ in replacements]
    try:
        for owner, name, value in replacements:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, original in reversed(saved):
            if original is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def run_recipe(
    name: str, steps: int, where: Path, precision: str, profile: str | None = None
) -> dict:
    """Recipe ``name``'s ``main`` in this process (on ``profile``, default its CPU profile),
    logging to ``where``, with its evaluations, saves and steps timed as spans and its
    sub-jobs' dtypes checked."""
    import importlib

    from cortex_recipes.cortex_client import ExplainedClient
    from cortex_recipes.plots import read_metrics
    from cortex_recipes.training_job import Trainer

    recipe = RECIPES[name]
    train = importlib.import_module(recipe.module)
    algorithm = getattr(train, recipe.algorithm)
    clock, jobs = Clock(), []

    def noting(wait_for_job):
        @functools.wraps(wait_for_job)
        def wait(*args, **kwargs):
            job = wait_for_job(*args, **kwargs)
            jobs.append(job)
            return job

        return wait

    replacements = [(algorithm, "step", clock.timed("step", algorithm.step))]
    replacements += [
        (algorithm, method, clock.timed("eval", getattr(algorithm, method)))
        for method in recipe.eval_methods
    ]
    replacements += [
        (train, function, clock.timed("eval_generate", getattr(train, function)))
        for function in recipe.generate_functions
    ]
    replacements += [
        (Trainer, method, clock.timed("save", getattr(Trainer, method)))
        for method in ("save_weights", "save_resumable")
    ]
    replacements.append((ExplainedClient, "wait_for_job", noting(ExplainedClient.wait_for_job)))
    config = train.Config(
        profile=profile or recipe.profile,
        steps=steps,
        log_path=str(where),
        overrides=overrides_for(precision),
    )
    with patched(replacements):
        clock.start()
        summary = train.main(config)
        total = clock.now()
    records = read_metrics(where)
    saves = where / "checkpoints.jsonl"
    lines = saves.read_text().splitlines() if saves.exists() else []
    saved = [json.loads(line) for line in lines if line.strip()]
    out = {
        "precision": backend_precision(jobs, PRECISIONS[precision]),
        **side_times([r["time/step"] for r in records], total, clock.spans),
        "eval_generate_s": round(span_total(clock.spans, "eval_generate"), 3),
        "save_recorded_s": round(sum(s.get("time/save_ckpt", 0.0) for s in saved), 3),
        "evaluations": recipe_evaluations(summary, steps),
    }
    for key, field, digits in recipe.series:
        out[key] = [round(r[field], digits) for r in records]
    return {**out, "spans": clock.rounded()}


def recipe_evaluations(summary: dict, steps: int) -> list[dict]:
    """The evaluations in a recipe's summary, as :func:`eval_summary` gives them."""
    if "eval_accuracy" in summary:  # Math GRPO
        return [
            {"step": e["step"], **eval_summary({"accuracy": e["accuracy"]})}
            for e in summary["eval_accuracy"]
        ]
    return [
        {"step": step, **eval_summary(summary[key])}
        for step, key in ((0, "eval_before"), (steps, "eval_after"))
        if summary.get(key)
    ]


# -- the TRL side ---------------------------------------------------------------------------


def lora_config(peft_config: dict):
    from peft import LoraConfig

    keys = ("r", "lora_alpha", "lora_dropout", "target_modules")
    return LoraConfig(task_type="CAUSAL_LM", **{k: peft_config[k] for k in keys})


def step_timer(clock: Clock):
    """A callback that adds a ``step`` span to ``clock`` from each step's ``on_step_begin`` to
    its ``on_step_end`` and keeps the steps' times."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begun = 0.0
            self.steps: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begun = clock.now()

        def on_step_end(self, args, state, control, **kwargs):
            end = clock.now()
            clock.add("step", self.begun, end)
            self.steps.append(end - self.begun)

    return StepTimer()


def eval_callback(evaluate: Callable[[int], None], eval_steps: set[int]):
    """A callback that runs ``evaluate(step)`` at the end of each step of ``eval_steps``."""
    from transformers import TrainerCallback

    class Evaluations(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in eval_steps:
                evaluate(state.global_step)

    return Evaluations()


def trl_arguments(
    work: Path, name: str, steps: int, learning_rate: float, seed: int, dtype: str
) -> dict:
    """The TrainingArguments both TRL sides share: a constant learning rate without warm-up or
    weight decay, on the CPU, in ``dtype``'s precision (set: TRL's default is bf16), seeded, a
    log line every step and nothing else written."""
    return {
        "output_dir": str(work / name),
        "max_steps": steps,
        "learning_rate": learning_rate,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "gradient_checkpointing": False,  # TRL's default is on; the recipe does not recompute
        "bf16": dtype == "bfloat16",
        "fp16": False,
        "use_cpu": True,
        "seed": seed,
        "data_seed": seed,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
    }


class InProcessSampler:
    """The two SDK calls the recipes' evaluation functions make (``generate``, then
    ``poll_request``), answered greedily by a model in this process the way the local
    backend's sampler answers them: the prompts left-padded into one batch, each row stopping
    after the tokenizer's or the model's end-of-sequence id (or one of ``stop_token_ids``),
    its ids returned with that stop id; under ``autocast`` (TRL's precision)."""

    def __init__(self, model, tokenizer, pad_id: int, autocast: Callable):
        self.model, self.pad_id, self.autocast = model, pad_id, autocast
        self.eos_ids: set[int] = set()
        for value in (tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None)):
            values = value if isinstance(value, list) else [value]
            self.eos_ids.update(v for v in values if isinstance(v, int))
        self.requests: dict[str, list[dict]] = {}
        self.made = 0

    def generate(self, job_id: str, prompts: Sequence[list[int]], params: dict) -> str:
        if params.get("temperature", 1.0) != 0.0:
            raise ValueError(f"greedy evaluation only; temperature={params.get('temperature')}")
        self.made += 1
        request_id = f"request-{self.made}"
        self.requests[request_id] = self._greedy(prompts, params)
        return request_id

    def poll_request(self, job_id: str, request_id: str) -> dict:
        return {"results": self.requests.pop(request_id)}

    def _greedy(self, prompts: Sequence[list[int]], params: dict) -> list[dict]:
        import torch
        from transformers import GenerationConfig

        stops = self.eos_ids | set(params.get("stop_token_ids") or ())
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        config = GenerationConfig(
            max_new_tokens=params["max_tokens"], do_sample=False, use_cache=True,
            eos_token_id=sorted(stops), pad_token_id=self.pad_id,
        )  # fmt: skip
        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.autocast():
                out = self.model.generate(
                    input_ids=ids, attention_mask=mask, generation_config=config
                )
        finally:
            self.model.train(training)
        return [{"token_ids": until_stop(row[width:].tolist(), stops)} for row in out]


def trl_evaluator(
    trainer, tokenizer, clock: Clock, evaluations: list, run: Callable[[Any], dict]
) -> Callable[[int], None]:
    """``evaluate(step)``: ``run(sampler)`` (one of the recipe's evaluation functions, its SDK
    calls answered by :class:`InProcessSampler` on the trainer's model), its
    :func:`eval_summary` appended to ``evaluations``, timed as an ``eval`` span."""
    from cortex_recipes import frames

    sampler = InProcessSampler(
        trainer.model, tokenizer, frames.pad_id(tokenizer), trainer.accelerator.autocast
    )

    def evaluate(step: int) -> None:
        evaluations.append({"step": step, **eval_summary(run(sampler))})

    return clock.timed("eval", evaluate)


def trl_train(
    trainer, clock: Clock, timer, dtype: str, series: tuple[str, str, int],
    evaluate: Callable[[int], None] | None, eval_steps: set[int], evaluations: list,
) -> dict:  # fmt: skip
    """Check the precision; when ``evaluate`` is given, evaluate before the first step and
    after each step of ``eval_steps`` (a callback after the step timer, so that its time is
    not the step's); train; the side's result. ``series``: (output key, logged key, digits)
    of the value logged each step."""
    precision = trl_precision(trainer, dtype)
    if evaluate is not None:
        trainer.add_callback(eval_callback(evaluate, eval_steps))
        evaluate(0)
    trainer.train()
    total = clock.now()
    out = {
        "precision": precision,
        **side_times(timer.steps, total, clock.spans),
        "evaluations": evaluations,
    }
    key, logged, digits = series
    out[key] = [round(h[logged], digits) for h in trainer.state.log_history if logged in h]
    return {**out, "spans": clock.rounded()}


def trl_sft(steps: int, work: Path, precision: str, same_evals: bool) -> dict:
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from cortex_recipes import frames, sft
    from cortex_recipes.models import load_causal_lm, load_tokenizer
    from cortex_recipes.supervision import make_renderer, render_supervised, truncate
    from recipes.sft.conversational.train import evaluate as sft_evaluate

    clock = Clock()
    profile = sft.load_profile(SFT_PROFILE, overrides_for(precision))
    tokenizer = load_tokenizer(profile.model)
    renderer = make_renderer(tokenizer, profile.renderer)
    rows = [
        truncate(
            render_supervised(messages, tokenizer, renderer, profile.train_on_what),
            profile.max_seq_len,
        )
        for messages in profile.conversations()
    ]
    # The recipe's batches, in the recipe's order: one TRL epoch over them, unshuffled.
    order = [i for batch in sft.batches(len(rows), profile.batch_size, steps, profile.seed)
             for i in batch]  # fmt: skip
    data = Dataset.from_list(
        [
            {
                "input_ids": list(rows[i].token_ids),
                "completion_mask": [int(w > 0) for w in rows[i].weights],
            }
            for i in order
        ]
    )
    torch.manual_seed(profile.seed)
    model = load_causal_lm(profile.model, profile.dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = frames.pad_id(tokenizer)
    timer = step_timer(clock)
    args = SFTConfig(
        **trl_arguments(work, "trl-sft", steps, profile.learning_rate, profile.seed, profile.dtype),
        per_device_train_batch_size=profile.batch_size,
        max_length=profile.max_seq_len,
        completion_only_loss=True,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=lora_config(profile.training["peft_config"]),
        callbacks=[timer],
    )
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(data)
    evaluate, evaluations = None, []
    if same_evals and profile.eval:  # the recipe answers before step 1 and after the last
        evaluate = trl_evaluator(
            trainer, tokenizer, clock, evaluations,
            lambda sampler: sft_evaluate(sampler, profile, tokenizer, "trl-sft"),
        )  # fmt: skip
    return trl_train(
        trainer, clock, timer, profile.dtype, ("losses", "loss", 4), evaluate, {steps}, evaluations
    )


def trl_grpo(steps: int, work: Path, precision: str, same_evals: bool) -> dict:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from cortex_recipes import driver
    from cortex_recipes.models import load_causal_lm, load_tokenizer
    from cortex_recipes.rl.grpo import greedy_eval, task_order
    from cortex_recipes.rl.grpo_profile import load_grpo_profile

    clock = Clock()
    profile = load_grpo_profile(GRPO_PROFILE, overrides_for(precision))
    env, eval_env = profile.envs()
    order = task_order(profile.env.seed, env.size)
    tasks = [env.task(order[g % env.size]) for g in range(steps * profile.groups_per_step)]
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": env.prompt(t)}], "task_index": t.index}
            for t in tasks
        ]
    )

    def reward(completions, task_index, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [env.score(env.task(i), text) for i, text in zip(task_index, texts, strict=True)]

    tokenizer = load_tokenizer(profile.model)
    torch.manual_seed(profile.seed)
    model = load_causal_lm(profile.model, profile.dtype)
    sampling = profile.orchestrator.sampling
    loss = profile.loss
    # The recipe's schedule: greedy eval before step 1, every eval.interval steps and the last.
    schedule = driver.Schedule(steps, eval_every=profile.eval.interval)
    eval_steps = {s for s in range(1, steps + 1) if schedule.evaluates(s)}
    timer = step_timer(clock)
    args = GRPOConfig(
        **trl_arguments(
            work, "trl-grpo", steps, profile.learning_rate, profile.seed, profile.dtype
        ),
        per_device_train_batch_size=profile.orchestrator.batch_size,
        num_generations=profile.group_size,
        max_completion_length=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=loss.eps_clip,
        loss_type="dapo",  # token-mean over the batch, the profile's loss_agg_mode
        num_iterations=1,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        log_completions=False,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=lora_config(profile.training["peft_config"]),
        callbacks=[timer],
    )
    evaluate, evaluations = None, []
    if same_evals:
        evaluate = trl_evaluator(
            trainer, tokenizer, clock, evaluations,
            lambda sampler: greedy_eval(
                sampler, "trl-grpo", tokenizer, eval_env, profile.eval_max_tokens
            ),
        )  # fmt: skip
    return trl_train(
        trainer, clock, timer, profile.dtype, ("rewards", "reward", 3), evaluate, eval_steps,
        evaluations,
    )  # fmt: skip


# -- the command ----------------------------------------------------------------------------


def check_profiles(
    precision: str, sft_profile: str = SFT_PROFILE, grpo_profile: str = GRPO_PROFILE
) -> str | None:
    """Why the profiles cannot run in ``precision`` (their dtype after the overrides), or None."""
    from cortex_recipes import sft
    from cortex_recipes.rl.grpo_profile import load_grpo_profile

    want = PRECISIONS[precision]
    for path, load in ((sft_profile, sft.load_profile), (grpo_profile, load_grpo_profile)):
        dtype = load(path, overrides_for(precision)).dtype
        if dtype != want:
            return f"{path} trains in {dtype}, not {want}: --precision {precision} needs {want}"
    return None


def default_out(machine: str, precision: str, project_only: bool = False) -> Path:
    suffix = "" if precision == "fp32" else f"_{precision}"
    day = time.strftime("%Y-%m-%d")
    name = "recipes_split" if project_only else "trl_side_by_side_fair"
    return ROOT / "bench" / "results" / f"{machine}-{day}" / f"{name}{suffix}.json"


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "trl", "peft", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4, help="steps of each side (>= 2)")
    parser.add_argument("--only", choices=("sft", "grpo"), help="one of the two comparisons")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="pairs of runs of each comparison (the order of the two sides alternates); the "
        "summary is the median of the pairs' values, the ratios with their range",
    )
    parser.add_argument(
        "--precision",
        choices=tuple(PRECISIONS),
        default="fp32",
        help="fp32: the profiles as shipped and TRL with bf16=False, fp16=False, a float32 "
        "model; bf16: the recipes with dtype=bfloat16 and TRL with bf16=True, a bfloat16 "
        "model (default: fp32)",
    )
    parser.add_argument(
        "--same-evals",
        action="store_true",
        help="TRL also runs the recipe's greedy evaluations (same prompts, scorer and points: "
        "before the first step, on the recipe's eval steps, after the last), timed as its "
        "evaluation phase, so the end-to-end totals compare the same work",
    )
    parser.add_argument(
        "--machine", default="cpu", help="the machine's name in the default --out folder"
    )
    parser.add_argument(
        "--out",
        help="write the JSON here (default: bench/results/<machine>-<date>/"
        "trl_side_by_side_fair.json, _fair_bf16.json for bf16); rewritten after every pair",
    )
    parser.add_argument(
        "--project-only",
        action="store_true",
        help="run only the recipes (no TRL, which need not be installed): each run's phase "
        "split, the medians over --repeat runs (the GPU check's end-to-end split)",
    )
    parser.add_argument("--sft-profile", default=SFT_PROFILE, help="SFT's profile (--project-only)")
    parser.add_argument(
        "--grpo-profile", default=GRPO_PROFILE, help="Math GRPO's profile (--project-only)"
    )
    args = parser.parse_args()
    if not args.project_only and (args.sft_profile, args.grpo_profile) != (
        SFT_PROFILE,
        GRPO_PROFILE,
    ):
        parser.error("--sft-profile / --grpo-profile: only with --project-only (TRL's side "
                     "is built for the CPU profiles)")  # fmt: skip
    if args.steps < 2:
        parser.error(f"--steps={args.steps}; accepted: 2 or more (step 1 is warm-up)")
    if args.repeat < 1:
        parser.error(f"--repeat={args.repeat}; accepted: 1 or more")
    problem = check_profiles(args.precision, args.sft_profile, args.grpo_profile)
    if problem:
        parser.error(problem)

    import logging

    import torch

    logging.basicConfig(level=logging.WARNING)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    work = Path(tempfile.mkdtemp(prefix="bench-trl-"))
    out = (
        Path(args.out) if args.out else default_out(args.machine, args.precision, args.project_only)
    )
    result: dict = {
        "steps": args.steps,
        "repeat": args.repeat,
        "precision": args.precision,
        "same_evals": args.same_evals,
        "cpu_count": threads,
        "torch_threads_trl": threads,
        "versions": versions(),
    }
    if not args.same_evals:
        result["note"] = (
            "TRL ran no evaluations and the recipe ran its own: the end-to-end totals compare "
            "different work (--same-evals makes TRL run the same ones)"
        )
    if args.project_only:
        result["note"] = "the recipes alone (--project-only): no TRL side, no ratios"
    profiles = {"sft": args.sft_profile, "math_grpo": args.grpo_profile}
    sides = {
        "sft": (functools.partial(run_recipe, "sft", profile=args.sft_profile), trl_sft),
        "math_grpo": (
            functools.partial(run_recipe, "math_grpo", profile=args.grpo_profile),
            trl_grpo,
        ),
    }
    for name, (ours, theirs) in sides.items():
        if args.only not in (None, name.removeprefix("math_")):
            continue
        if args.project_only:
            runs = []
            for i in range(args.repeat):
                runs.append(ours(args.steps, work / f"{name}-{i}" / "project", args.precision))
                result[name] = {"profile": profiles[name], **summarise_project(runs)}
                write(out, work, result)
            continue
        pairs: list[dict] = []
        for i in range(args.repeat):
            where = work / f"{name}-{i}"
            project = functools.partial(ours, args.steps, where / "project", args.precision)
            trl = functools.partial(theirs, args.steps, where, args.precision, args.same_evals)
            pairs.append(run_pair(i, project, trl))
            result[name] = summarise(pairs)
            write(out, work, result)
    print(json.dumps({"work": str(work), "out": str(out), "result": result}, indent=2))


def run_pair(index: int, project: Callable[[], dict], trl: Callable[[], dict]) -> dict:
    """Pair ``index``: the recipe first on even pairs, TRL first on odd ones (so that drift in
    the machine does not favour one side)."""
    if index % 2:
        theirs = trl()
        return compare(project(), theirs)
    mine = project()
    return compare(mine, trl())


def write(out: Path, work: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"work": str(work), "result": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
