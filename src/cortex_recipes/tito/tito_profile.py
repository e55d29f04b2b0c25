"""TITO journey profiles (checked-in JSON): model, renderer, warm-start SFT, RL, budgets.

Typed by :mod:`cortex_recipes.profiles`; ``steps=2`` (the RL steps) and the like override any field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cortex_recipes import profiles
from cortex_recipes.grpo_loss import GRPOLoss
from cortex_recipes.profiles import Ckpt, setting
from cortex_recipes.sub_jobs import batch_problem

# A renderer with a token-exact bridge between turns; chat-template rendering cannot
# guarantee token extension.
RENDERERS = ("qwen3",)
QUESTION_TYPES = ("compare", "chain")
# Turns waiting in a lockstep batch each hold one of the gateway's worker threads (40).
MAX_PLAY_TOGETHER = 32


@dataclass(frozen=True)
class WarmStart:
    """SFT on tool-use demonstrations before RL."""

    steps: int = setting(ge=0, doc="SFT steps (0: none)")
    batch_size: int = setting(
        gt=0, doc="demonstrations per step, across all GPUs (the global batch)"
    )
    learning_rate: float = setting(gt=0, doc="AdamW learning rate of the warm start")
    complete_share: float = setting(
        1.0,
        ge=0,
        doc="chain questions: the share of demonstrations (at most 1) that make the second "
        "lookup; the rest stop after the first and answer with what it returned (a "
        "demonstrator that gives up early), placed by a seeded shuffle",
    )


@dataclass(frozen=True)
class RL:
    """The RL phase: episodes through the gateway, action-masked grpo."""

    tasks_per_step: int = setting(gt=0, doc="tasks per step")
    group_size: int = setting(ge=2, doc="episodes per task (group-relative advantages)")
    max_turns: int = setting(ge=2, doc="model turns per episode (a call turn and an answer)")
    max_tokens: int = setting(gt=0, doc="new tokens per model turn")
    temperature: float = setting(ge=0, doc="sampling temperature of the episodes")
    eps_clip: float = setting(GRPOLoss.eps_clip, ge=0, doc="PPO ratio clip")
    play_together: int = setting(
        16,
        gt=0,
        doc="episodes played at once, their turns sampled as one batch (at most 32: the "
        "gateway serves that many waiting turns)",
    )

    def loss_config(self) -> dict[str, Any]:
        """The ``grpo`` config the RL phase trains with (:mod:`cortex_recipes.grpo_loss`)."""
        return {"eps_clip": self.eps_clip}


@dataclass(frozen=True)
class Eval:
    """Greedy evaluation."""

    max_tokens: int | None = setting(None, gt=0, doc="new tokens per greedy turn")


@dataclass(frozen=True)
class TitoProfile(profiles.JourneyProfile):
    """A TITO profile (recipes/agentic/tito/configs/*.json): ``steps`` and ``learning_rate``
    are the RL phase's; the warm start has its own."""

    renderer: str = setting(choices=RENDERERS, doc="a renderer with a token-exact bridge")
    warm_start: WarmStart = setting(doc="SFT on demonstrations before RL")
    rl: RL = setting(doc="the RL phase")
    tasks: str = setting(
        "data/glossary.jsonl",
        doc="the glossary: a file (.json, .jsonl, .parquet; relative to the recipe folder) or "
        "hub:<owner>/<name>@<commit>[:<split>], with 'name' and 'fact' columns, loaded "
        "through datasets; one task per row, the lookup tool answers from the same rows",
    )
    questions: str = setting(
        "",
        doc="comparison questions (first, second, ask, answer columns; a file or a pinned Hub "
        "id like tasks): each episode looks up two glossary entities and names one; empty: one "
        "lookup task per glossary row",
    )
    eval_questions: str = setting(
        "",
        doc="held-out comparison questions for the greedy eval (same columns); empty: evaluate "
        "on the training tasks",
    )
    question_type: str = setting(
        "compare",
        choices=QUESTION_TYPES,
        doc="compare: questions name first and second, looked up at once; chain: questions "
        "name start, via, ask and answer, where start's fact names via and via's fact holds "
        "the answer, so the two lookups come one after the other",
    )
    add_renderer_tokens: bool = setting(
        False,
        doc="run on a copy of the model with the renderer's missing special tokens added (a "
        "ChatML model such as SmolLM2 without tool tokens; local backend only)",
    )
    eval: Eval = setting(default_factory=Eval, doc="greedy evaluation")
    ckpt: Ckpt = setting(default_factory=Ckpt, doc="resumable checkpoints")

    def check(self) -> str | None:
        if self.rl.play_together > MAX_PLAY_TOGETHER:
            return (
                f"rl.play_together={self.rl.play_together} must be at most {MAX_PLAY_TOGETHER} "
                "(the gateway serves that many waiting turns at once)"
            )
        if self.eval_questions and not self.questions:
            return "eval_questions needs questions: held-out comparisons of a comparison task"
        if self.warm_start.complete_share > 1:
            return f"warm_start.complete_share={self.warm_start.complete_share} must be at most 1"
        if self.warm_start.complete_share < 1 and not (
            self.questions and self.question_type == "chain"
        ):
            return (
                f"warm_start.complete_share={self.warm_start.complete_share} applies only to "
                "chain questions (question_type chain with questions)"
            )
        return batch_problem(
            self.training, self.warm_start.batch_size, self.n_gpus, "warm_start.batch_size"
        )

    @property
    def weight_format(self) -> str:
        """How weights reach the sampler: the LoRA adapter alone under peft, else full weights."""
        return "lora" if self.training.get("peft_config") else "hf"

    def sub_jobs(self, model: str | None = None) -> list:
        """The sub-jobs, on ``model`` (a prepared copy of the profile's) when given."""
        return self.trainer_and_sampler(
            self.warm_start.batch_size,
            model=model or self.model, learning_rate=self.warm_start.learning_rate,
        )  # fmt: skip


def load_tito_profile(path: str | Path, overrides: Sequence[str] = ()) -> TitoProfile:
    """The typed profile in ``path``, with ``key=value`` ``overrides`` applied."""
    path = Path(path)
    profile, raw = profiles.load(TitoProfile, path, overrides)
    return replace(profile, path=path, raw=raw)
