"""GRPO profiles (checked-in JSON) for the synchronous and asynchronous math journeys.

The fields every journey shares (``model``, ``steps``, ``learning_rate``, ``training``, ...)
are :class:`cortex_recipes.profiles.JourneyProfile`'s; the rest follow prime-rl where it has
a name (``batch_size`` = rollouts per step, ``group_size``, ``max_off_policy_steps``,
``ckpt.interval``, ``eval.interval``; ``steps`` is prime-rl's ``max_steps``):
docs/async-grpo.md maps them one by one. A profile is asynchronous (the async GRPO journey, on
prime-rl's orchestrator) when it sets ``orchestrator.max_off_policy_steps``. The typed
layer is :mod:`cortex_recipes.profiles`; ``learning_rate=1e-4`` and the like
override any field from the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cortex_recipes import profiles
from cortex_recipes.profiles import Ckpt, setting
from cortex_recipes.sub_jobs import batch_problem

WEIGHT_FORMATS = ("hf", "lora")
LR_SCHEDULES = ("constant", "linear")


def scheduled_learning_rate(base: float, schedule: str, step: int, steps: int) -> float:
    """The learning rate of optimiser step ``step`` (1-based) of ``steps``: ``constant`` keeps
    ``base``; ``linear`` decays it by ``base / steps`` a step, ``base`` at step 1 to
    ``base / steps`` at the last (sent with each step as ``step(learning_rate=...)``)."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule={schedule!r}; one of {list(LR_SCHEDULES)}")
    if not 1 <= step <= steps:
        raise ValueError(f"step={step} is outside 1..{steps}")
    if schedule == "constant":
        return base
    return base * (1.0 - (step - 1) / steps)


@dataclass(frozen=True)
class Loss:
    """The ``grpo`` processor's settings; only those set are sent (the rest are
    :class:`cortex_recipes.grpo_loss.GRPOLoss`'s defaults, which the service applies)."""

    eps_clip: float | None = setting(None, ge=0, doc="PPO ratio clip (lower side)")
    eps_clip_higher: float | None = setting(None, ge=0, doc="PPO ratio clip (upper side)")
    loss_agg_mode: str | None = setting(
        None, doc="how token losses are averaged (token-mean, ...; the server checks it)"
    )
    entropy_coeff: float | None = setting(None, doc="entropy bonus weight")
    c_clip: float | None = setting(None, gt=1, doc="dual clip of negative-advantage tokens")
    importance_sampling_level: str | None = setting(
        None, choices=("token", "sequence"), doc="one ratio per token, or per row (GSPO)"
    )
    use_decoupled_loss: bool | None = setting(
        None,
        doc="off-policy correction: clip around the proximal policy (the trainer's weights "
        "before this step, recomputed with a forward) and weight by prox / behaviour",
    )
    prox_logp_method: str | None = setting(
        None,
        choices=("recompute", "loglinear", "metrics"),
        doc="decoupled loss: the proximal policy recomputed by a forward, or interpolated "
        "between the behaviour and current policies by version (async GRPO sends the versions)",
    )
    behav_imp_weight_cap: float | None = setting(
        None, gt=0, doc="decoupled loss: tokens whose behaviour weight exceeds it are dropped"
    )
    m2_threshold: float | None = setting(None, ge=0, doc="M2PO second-moment mask")
    use_cispo_loss: bool | None = setting(None, doc="CISPO surrogate")
    is_weight_clip_max: float | None = setting(None, gt=0, doc="CISPO weight cap")
    use_sapo_loss: bool | None = setting(None, doc="SAPO soft gate instead of the hard clip")

    def as_config(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class Sampling:
    """Rollout sampling parameters."""

    max_tokens: int = setting(gt=0, doc="new tokens per rollout")
    temperature: float = setting(1.0, ge=0, doc="sampling temperature")
    top_p: float = setting(1.0, gt=0, doc="nucleus sampling mass")


@dataclass(frozen=True)
class Orchestrator:
    """Rollouts per step and, for the async journey, prime-rl's bound on policy lag."""

    batch_size: int = setting(
        gt=0, doc="rollouts per optimiser step, all groups and GPUs together (the global batch)"
    )
    group_size: int = setting(ge=2, doc="rollouts per problem (group-relative advantages)")
    sampling: Sampling = setting(doc="sampling parameters")
    max_off_policy_steps: int | None = setting(
        None,
        ge=0,
        doc="async only (prime-rl's orchestrator): rollouts more than this many policy versions "
        "behind the trainer are cancelled or dropped",
    )
    max_inflight_groups: int | None = setting(
        None, ge=1, doc="async only: groups in flight (prime-rl's fixed concurrency; default 1)"
    )

    def check(self) -> str | None:
        if self.batch_size % self.group_size:
            return (
                f"batch_size={self.batch_size} must be a multiple of "
                f"orchestrator.group_size={self.group_size}"
            )
        if self.max_inflight_groups is not None and self.max_off_policy_steps is None:
            return (
                f"max_inflight_groups={self.max_inflight_groups} is an async setting: an "
                "asynchronous profile sets orchestrator.max_off_policy_steps"
            )
        return None


@dataclass(frozen=True)
class Env:
    """The training problems: a reasoning-gym generator, or a task file through ``datasets``."""

    dataset: str = setting(doc="the reasoning-gym dataset name, e.g. basic_arithmetic")
    seed: int = setting(doc="the generator's seed")
    size: int = setting(gt=0, doc="problems in the training set")
    config: dict[str, Any] | None = setting(None, doc="the dataset's generator settings")
    instruction: str | None = setting(None, doc="appended to every question")
    latency_s: float = setting(
        0.0,
        ge=0,
        doc="a simulated slow environment: seconds every rollout waits before it is scored "
        "(like a sandbox or tool call; rollouts wait concurrently)",
    )
    reward: str = setting(
        "dataset",
        choices=("dataset", "exact"),
        doc="dataset: the reasoning-gym dataset's own score_answer (partial credit when the "
        "answer is a substring of the reply's first integer; exact for a task file); exact: "
        "1.0 when the reply's first integer is the answer, else 0.0 (what the greedy eval counts)",
    )
    tasks: str | None = setting(
        None,
        doc="training problems from a file (.json, .jsonl, .parquet; relative to the recipe "
        "folder) or hub:<owner>/<name>@<commit>[:<split>], with 'question' and integer "
        "'answer' columns, loaded through datasets; the first env.size rows are used, scored "
        "by the first integer of the reply; replaces the reasoning-gym generator for training",
    )


@dataclass(frozen=True)
class Eval:
    """Greedy evaluation on a fixed problem set."""

    interval: int = setting(5, ge=1, doc="evaluate every this many steps (and after the last)")
    num_examples: int = setting(32, gt=0, doc="problems in the eval set")
    seed: int = setting(12345, doc="the eval set's generator seed")
    max_tokens: int | None = setting(None, gt=0, doc="default: orchestrator.sampling.max_tokens")
    tasks: str | None = setting(
        None,
        doc="eval problems from a file or a pinned Hub id, as env.tasks (the first "
        "num_examples rows); default: env.dataset's generator with this seed",
    )


@dataclass(frozen=True)
class GRPOProfile(profiles.JourneyProfile):
    """A GRPO profile (recipes/rl/*/configs/*.json)."""

    orchestrator: Orchestrator = setting(doc="rollouts per step and the policy-lag bounds")
    env: Env = setting(doc="the training environment")
    weight_format: str = setting("hf", choices=WEIGHT_FORMATS, doc="weight sync format")
    loss: Loss = setting(default_factory=Loss, doc="the grpo processor's settings")
    lr_schedule: str = setting(
        "constant",
        choices=LR_SCHEDULES,
        doc="constant: learning_rate every step; linear: decayed from learning_rate at step 1 "
        "by learning_rate/steps a step",
    )
    eval: Eval = setting(default_factory=Eval, doc="greedy evaluation")
    ckpt: Ckpt | None = setting(None, doc="resumable checkpoints")

    def check(self) -> str | None:
        if self.weight_format == "lora" and not self.training.get("peft_config"):
            return "weight_format='lora' needs training.peft_config"
        return batch_problem(
            self.training, self.orchestrator.batch_size, self.n_gpus, "orchestrator.batch_size"
        )

    @property
    def group_size(self) -> int:
        return self.orchestrator.group_size

    @property
    def groups_per_step(self) -> int:
        return self.orchestrator.batch_size // self.group_size

    @property
    def is_async(self) -> bool:
        return self.orchestrator.max_off_policy_steps is not None

    @property
    def eval_max_tokens(self) -> int:
        return self.eval.max_tokens or self.orchestrator.sampling.max_tokens

    def sampling_params(self) -> dict[str, Any]:
        s = self.orchestrator.sampling
        return {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}

    def envs(self):
        """The training environment and the fixed eval set: task files when ``env.tasks`` /
        ``eval.tasks`` name them, else the reasoning-gym generator (the eval with its seed)."""
        from cortex_recipes.envs.math import MathEnv, TaskTableEnv

        text: dict[str, Any] = {}
        if self.env.instruction is not None:
            text["instruction"] = self.env.instruction
        extra: dict[str, Any] = {"config": self.env.config, **text}

        def build(field: str, tasks: str | None, seed: int, size: int):
            if tasks:
                return TaskTableEnv(field, tasks, self.recipe_dir, size=size, **text)
            exact = self.env.reward == "exact"
            return MathEnv(self.env.dataset, seed=seed, size=size, exact=exact, **extra)

        env = build("env.tasks", self.env.tasks, self.env.seed, self.env.size)
        eval_env = build("eval.tasks", self.eval.tasks, self.eval.seed, self.eval.num_examples)
        return env, eval_env

    def loss_config(self) -> dict[str, Any]:
        return self.loss.as_config()

    def learning_rate_at(self, step: int, steps: int) -> float:
        """Step ``step``'s learning rate under ``lr_schedule`` in a run of ``steps`` steps."""
        return scheduled_learning_rate(self.learning_rate, self.lr_schedule, step, steps)

    def sub_jobs(self) -> list:
        """Trainer and sampler on the same model (the sampler gets any LoRA shape)."""
        return self.trainer_and_sampler(self.orchestrator.batch_size)


def load_grpo_profile(path: str | Path, overrides: Sequence[str] = ()) -> GRPOProfile:
    """The typed profile in ``path``, with ``key=value`` ``overrides`` applied."""
    path = Path(path)
    profile, raw = profiles.load(GRPOProfile, path, overrides)
    return replace(profile, path=path, raw=raw)
