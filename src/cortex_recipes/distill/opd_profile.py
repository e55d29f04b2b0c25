"""On-policy distillation profiles (checked-in JSON configs), typed by cortex_recipes.profiles."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cortex_recipes import profiles
from cortex_recipes.grpo_loss import GRPOLoss, teacher_config
from cortex_recipes.profiles import setting
from cortex_recipes.sub_jobs import batch_problem


@dataclass(frozen=True)
class Reward:
    """A task reward on each completion, next to the teacher term (``teacher_tau=0``: alone)."""

    contains: str = setting(
        doc="1.0 when the completion contains this text (case-insensitive), else 0.0"
    )
    excludes: list[str] = setting(
        default_factory=list,
        doc="0.0 when the completion also contains any of these (case-insensitive)",
    )

    def score(self, completion: str) -> float:
        text = completion.lower()
        hit = self.contains.lower() in text
        return float(hit and not any(x.lower() in text for x in self.excludes))


@dataclass(frozen=True)
class OPDProfile(profiles.JourneyProfile):
    """An on-policy distillation profile (recipes/distillation/on_policy/configs/*.json)."""

    teacher_model: str = setting(doc="the frozen teacher; it must share the student's tokenizer")
    prompts: str = setting(
        doc="rows of {prompt: ...}: a .json/.jsonl/.parquet file relative to the recipe "
        "folder, or hub:<owner>/<name>@<commit>[:<split>] (docs/datasets.md)"
    )
    rollouts_per_step: int = setting(
        gt=0, doc="student rollouts per optimiser step, across all GPUs (the global batch)"
    )
    max_tokens: int = setting(gt=0, doc="new tokens per rollout")
    teacher_tau: float = setting(ge=0, doc="weight of the teacher term; 0 turns the teacher off")
    teacher_sft: str | None = setting(
        None,
        doc="an SFT journey profile (recipes/sft/conversational/configs/<name>.json) whose "
        "model is teacher_model: the teacher is that model after the SFT run, exported "
        "with LoRA merged (trained first when its run folder holds no finished run; local "
        "backend only)",
    )
    eval_prompts: str | None = setting(
        None,
        doc="held-out prompts for the eval, as prompts (default: the training prompts)",
    )
    reward: Reward | None = setting(
        None, doc="a task reward (group-relative advantages); default: none, pure distillation"
    )
    group_size: int = setting(
        1, ge=1, doc="rollouts per prompt; rollouts_per_step must be a multiple of it"
    )
    temperature: float = setting(1.0, ge=0, doc="student sampling temperature")
    eval_interval: int = setting(5, ge=1, doc="evaluate every this many steps (and the last)")
    teacher_clip: float | None = setting(
        None, doc="cap on a positive teacher - student log ratio (needed when teacher_tau > 0)"
    )
    teacher_clip_negative: float | None = setting(
        None, gt=0, doc="cap on a negative ratio (default: teacher_clip)"
    )
    eps_clip: float = setting(
        GRPOLoss.eps_clip, ge=0, doc="PPO ratio clip between sampler and trainer"
    )
    weight_format: str = setting("hf", choices=("hf", "lora"), doc="weight sync format")
    alignment_tolerance: float = setting(
        0.05,
        gt=0,
        doc="start-up alignment probe: the largest mean |forward - sampler| "
        "logprob (nats) over the probe's tokens; an off-by-one scorer differs by nats",
    )

    def check(self) -> str | None:
        problem = batch_problem(self.training, self.rollouts_per_step, self.n_gpus,
                                "rollouts_per_step")  # fmt: skip
        if problem:
            return problem
        if self.rollouts_per_step % self.group_size:
            return (
                f"rollouts_per_step={self.rollouts_per_step} is not a multiple of "
                f"group_size={self.group_size}"
            )
        if self.reward is not None and self.group_size < 2:
            return (
                f"reward={{'contains': {self.reward.contains!r}}} needs group_size >= 2 "
                f"(group-relative advantages), got group_size={self.group_size}"
            )
        if self.reward is not None and not self.reward.contains.strip():
            return "reward.contains='' matches every completion; name the text to look for"
        if self.teacher_tau == 0 and self.reward is None:
            return "teacher_tau=0 with no reward trains on nothing; set a reward or teacher_tau"
        if self.teacher_tau > 0 and (self.teacher_clip is None or self.teacher_clip <= 0):
            return (
                f"teacher_tau={self.teacher_tau} needs a positive teacher_clip, "
                f"got {self.teacher_clip!r}"
            )
        return None

    def prompt_texts(self) -> list[str]:
        """The ``prompt`` column of ``prompts``, through ``datasets`` (cortex_recipes.data)."""
        return self._prompts("prompts", self.prompts)

    def eval_prompt_texts(self) -> list[str]:
        """The eval's prompts: ``eval_prompts`` when set, else the training prompts."""
        if self.eval_prompts is None:
            return self.prompt_texts()
        return self._prompts("eval_prompts", self.eval_prompts)

    def _prompts(self, field: str, source: str) -> list[str]:
        from cortex_recipes.data import load_records, prompt_column

        rows = load_records(field, source, self.recipe_dir, {"prompt": prompt_column})
        return [row["prompt"] for row in rows]

    def loss_config(self) -> dict[str, Any]:
        """The ``grpo`` config: the PPO clip and the teacher terms (:mod:`cortex_recipes.grpo_loss`)."""
        teacher = teacher_config(self.teacher_tau, self.teacher_clip, self.teacher_clip_negative)
        return {"eps_clip": self.eps_clip, **teacher}

    def sub_jobs(self, teacher: str | None = None) -> list:
        """Student trainer, student sampler, frozen teacher -- the sampler before the teacher,
        because the SDK checks prompt lengths against the first inference_config it finds.
        ``teacher``: the model the teacher sub-job loads (default ``teacher_model``; a
        ``teacher_sft`` run's exported directory)."""
        return self.trainer_and_sampler(
            self.rollouts_per_step, teacher=teacher or self.teacher_model
        )


def load_opd_profile(path: str | Path, overrides: Sequence[str] = ()) -> OPDProfile:
    """The typed profile in ``path``, with ``key=value`` ``overrides`` applied."""
    path = Path(path)
    profile, raw = profiles.load(OPDProfile, path, overrides)
    return replace(profile, path=path, raw=raw)
