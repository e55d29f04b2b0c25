"""The project's SFT and Math GRPO step times beside TRL's trainers, in one run on one machine.

Each side trains the same model (the profile's, loaded from the same offline files), on the
same rendered data or the same problems, with the same LoRA, learning rate, batch and group
sizes, sampling settings and seeds:

- **SFT**: ``recipes.sft.conversational`` (SDK -> HTTP -> the local backend's trainer worker,
  ``causal_cross_entropy``) against TRL's ``SFTTrainer`` in this process, fed the very token
  ids and masks the recipe renders (``completion_mask`` = the recipe's supervised tokens);
- **Math GRPO**: ``recipes.rl.math_grpo`` (sample through the backend's sampler, score, train,
  step, weight sync) against TRL's ``GRPOTrainer`` (``model.generate`` in this process, no
  vLLM) with reasoning-gym's scorer as its reward function.

The recipe runs as shipped (its profile, its backend, the backend's own thread allocation);
TRL gets every core of the machine (``torch.set_num_threads``) and runs without its default
activation checkpointing (the recipe's trainer does not recompute activations either). A step's time is the recipe's
``time/step`` metric and, for TRL, the time from a step's ``on_step_begin`` to its
``on_step_end``. Step 1 of each side is left out of the median (allocator and cache warm-up).
Besides the step ratio it prints each side's wall time from the command's start to its last
step (model load and, for the recipe, backend start and the evaluations the recipe runs).

    python3 -m uv run --frozen --all-extras python bench/trl_side_by_side.py --steps 4
    python3 -m uv run --frozen --all-extras python bench/trl_side_by_side.py --only sft --repeat 5

On a small shared machine one pair of runs does not resolve a few percent (TRL's own step times
moved by up to 25% between runs here): ``--repeat N`` runs N pairs, alternating which side goes
first, and reports the median of the pairs' ratios with their range.

Needs the ``bench`` extra (TRL); no journey imports TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the recipes package

SFT_PROFILE = "recipes/sft/conversational/configs/local-cpu-smollm2-lora.json"
GRPO_PROFILE = "recipes/rl/math_grpo/configs/local-cpu-smollm2-lora.json"


def lora_config(peft_config: dict):
    from peft import LoraConfig

    keys = ("r", "lora_alpha", "lora_dropout", "target_modules")
    return LoraConfig(task_type="CAUSAL_LM", **{k: peft_config[k] for k in keys})


def step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begun = 0.0
            self.steps: list[float] = []
            self.last_end = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.begun = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.last_end = time.perf_counter()
            self.steps.append(self.last_end - self.begun)

    return StepTimer()


def warm_median(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def run_recipe(train_module: str, work: Path, name: str, **config) -> tuple[list[dict], float]:
    """``<train_module>.main`` in this process, logging to ``work/name``: the metrics records
    it wrote and its wall time in seconds (to 0.1 s)."""
    import importlib

    from cortex_recipes.plots import read_metrics

    train = importlib.import_module(train_module)
    started = time.perf_counter()
    train.main(train.Config(log_path=str(work / name), **config))
    wall = time.perf_counter() - started
    return read_metrics(work / name), round(wall, 1)


def trl_arguments(work: Path, name: str, steps: int, learning_rate: float, seed: int) -> dict:
    """The TrainingArguments both TRL sides share: a constant learning rate without warm-up or
    weight decay, on the CPU, seeded, a log line every step and nothing else written."""
    return {
        "output_dir": str(work / name),
        "max_steps": steps,
        "learning_rate": learning_rate,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "gradient_checkpointing": False,  # TRL's default is on; the recipe does not recompute
        "use_cpu": True,
        "seed": seed,
        "data_seed": seed,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
    }


def trl_train(trainer, timer, started: float, key: str, logged: str, digits: int) -> dict:
    """Train; each step's time, the ``logged`` value of each step (rounded to ``digits``) as
    ``key`` and the wall time from ``started`` to the last step's end."""
    trainer.train()
    values = [round(h[logged], digits) for h in trainer.state.log_history if logged in h]
    return {
        "step_s": [round(t, 3) for t in timer.steps],
        key: values,
        "wall_s": round(timer.last_end - started, 1),
    }


# -- SFT -------------------------------------------------------------------------------------


def project_sft(steps: int, work: Path) -> dict:
    records, wall = run_recipe(
        "recipes.sft.conversational.train", work, "sft", profile=SFT_PROFILE, steps=steps
    )
    return {
        "step_s": [r["time/step"] for r in records],
        "losses": [round(r["loss"], 4) for r in records],
        "wall_s": wall,
    }


def trl_sft(steps: int, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from cortex_recipes import frames, sft
    from cortex_recipes.models import load_causal_lm, load_tokenizer
    from cortex_recipes.supervision import make_renderer, render_supervised, truncate

    started = time.perf_counter()
    profile = sft.load_profile(SFT_PROFILE, ())
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
    timer = step_timer()
    args = SFTConfig(
        **trl_arguments(work, "trl-sft", steps, profile.learning_rate, profile.seed),
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
    return trl_train(trainer, timer, started, "losses", "loss", 4)


# -- Math GRPO -------------------------------------------------------------------------------


def project_grpo(steps: int, work: Path) -> dict:
    records, wall = run_recipe(
        "recipes.rl.math_grpo.train", work, "grpo", profile=GRPO_PROFILE, steps=steps
    )
    return {
        "step_s": [r["time/step"] for r in records],
        "rollouts_s": [r["time/rollouts"] for r in records],
        "train_s": [r["time/train"] for r in records],
        "rewards": [round(r["reward/mean"], 3) for r in records],
        "wall_s": wall,
    }


def trl_grpo(steps: int, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from cortex_recipes.models import load_causal_lm, load_tokenizer
    from cortex_recipes.rl.grpo import task_order
    from cortex_recipes.rl.grpo_profile import load_grpo_profile

    started = time.perf_counter()
    profile = load_grpo_profile(GRPO_PROFILE, ())
    env, _ = profile.envs()
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
    timer = step_timer()
    args = GRPOConfig(
        **trl_arguments(work, "trl-grpo", steps, profile.learning_rate, profile.seed),
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
    return trl_train(trainer, timer, started, "rewards", "reward", 3)


def compare(ours: dict, trl: dict) -> dict:
    return {
        "project_step_median_s": round(warm_median(ours["step_s"]), 3),
        "trl_step_median_s": round(warm_median(trl["step_s"]), 3),
        "ratio_project_over_trl": round(
            warm_median(ours["step_s"]) / warm_median(trl["step_s"]), 3
        ),
        "wall_ratio_project_over_trl": round(ours["wall_s"] / trl["wall_s"], 3),
        "project": ours,
        "trl": trl,
    }


def summarise(pairs: list[dict]) -> dict:
    """The median of the pairs' step and wall ratios with their range, then every pair."""
    out = {}
    for key in ("ratio_project_over_trl", "wall_ratio_project_over_trl"):
        values = [pair[key] for pair in pairs]
        out[key] = round(statistics.median(values), 3)
        out[key.replace("ratio", "ratio_range", 1)] = [min(values), max(values)]
    return {**out, "pairs": pairs}


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
        "summary is the median of the pairs' ratios with their range",
    )
    parser.add_argument("--out", help="also write the JSON result here")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error(f"--steps={args.steps}; accepted: 2 or more (step 1 is warm-up)")
    if args.repeat < 1:
        parser.error(f"--repeat={args.repeat}; accepted: 1 or more")

    import logging

    import torch

    logging.basicConfig(level=logging.WARNING)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    work = Path(tempfile.mkdtemp(prefix="bench-trl-"))
    result: dict = {"steps": args.steps, "cpu_count": threads, "torch_threads_trl": threads}
    result["repeat"] = args.repeat
    sides = {"sft": (project_sft, trl_sft), "math_grpo": (project_grpo, trl_grpo)}
    for name, (ours, theirs) in sides.items():
        if args.only not in (None, name.removeprefix("math_")):
            continue
        pairs = []
        for i in range(args.repeat):
            where = work / f"{name}-{i}"
            if i % 2 == 0:
                mine = ours(args.steps, where)
                pairs.append(compare(mine, theirs(args.steps, where)))
            else:  # TRL first, so that drift in the machine does not favour one side
                other = theirs(args.steps, where)
                pairs.append(compare(ours(args.steps, where), other))
        result[name] = pairs[0] if args.repeat == 1 else summarise(pairs)
    text = json.dumps({"work": str(work), "result": result}, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
