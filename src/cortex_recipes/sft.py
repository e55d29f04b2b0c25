"""The conversational SFT journey's pieces: the typed profile, data, sub-jobs."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cortex_recipes import profiles
from cortex_recipes.profiles import ProfileError, setting
from cortex_recipes.sub_jobs import DS_BATCH_FIELDS, batch_problem
from cortex_recipes.supervision import RENDERERS, TrainOnWhat

__all__ = [
    "DS_BATCH_FIELDS",
    "Behaviour",
    "EvalSpec",
    "ProfileError",
    "SFTProfile",
    "WeightComparison",
    "load_profile",
]


@dataclass(frozen=True)
class Behaviour:
    """One taught answer, its training weight and its held-out prompts."""

    answer: str = setting(doc="the assistant answer the data teaches (exact message content)")
    weight: float = setting(gt=0, doc="the weight every training message with this answer carries")
    prompts: list[str] = setting(doc="held-out user prompts; item k is paired with the other's k")


@dataclass(frozen=True)
class WeightComparison:
    """Held-out log-likelihood gain of a full-weight answer against a down-weighted one."""

    full: Behaviour = setting(doc="the answer trained at the larger weight")
    down: Behaviour = setting(doc="the answer trained at the smaller (fractional) weight")

    def check(self) -> str | None:
        if not self.down.weight < self.full.weight:
            return f"down.weight={self.down.weight} must be below full.weight={self.full.weight}"
        if len(self.full.prompts) != len(self.down.prompts) or not self.full.prompts:
            return (
                f"full.prompts has {len(self.full.prompts)} and down.prompts "
                f"{len(self.down.prompts)}; the items are paired, so both need the same "
                "number (at least one)"
            )
        return None

    def check_data(self, conversations: Sequence[Sequence[dict[str, Any]]]) -> None:
        """Fail closed unless every training message with either answer carries its declared
        weight and both answers are in the data."""
        seen = {self.full.answer: 0, self.down.answer: 0}
        declared = {self.full.answer: self.full.weight, self.down.answer: self.down.weight}
        for n, messages in enumerate(conversations):
            for i, message in enumerate(messages):
                content = message.get("content")
                if message.get("role") != "assistant" or content not in declared:
                    continue
                seen[content] += 1
                weight = message.get("weight", 1.0)
                if weight != declared[content]:
                    raise ProfileError(
                        f"conversation {n} messages[{i}].weight={weight!r} but "
                        f"eval.weight_comparison declares {declared[content]} for {content!r}"
                    )
        missing = [answer for answer, count in seen.items() if not count]
        if missing:
            raise ProfileError(
                f"eval.weight_comparison answer(s) {missing} appear in no assistant message "
                "of the dataset"
            )


@dataclass(frozen=True)
class EvalSpec:
    """Greedy evaluation before and after training."""

    prompts: list[str] = setting(doc="held-out user prompts, answered greedily")
    expect: str = setting(doc="the substring a taught answer contains")
    controls: list[dict[str, Any]] = setting(
        default_factory=list, doc="{prompt, expect} pairs the training must not break"
    )
    max_tokens: int = setting(24, gt=0, doc="new tokens per greedy answer")
    weight_comparison: WeightComparison | None = setting(
        None, doc="held-out log-likelihood of a full-weight and a down-weighted answer"
    )


@dataclass(frozen=True)
class SFTProfile(profiles.JourneyProfile):
    """A conversational SFT profile (configs/*.json)."""

    dataset: str = setting(
        doc="rows of {messages: [...]}: a .json/.jsonl/.parquet file relative to the recipe "
        "folder, or hub:<owner>/<name>@<commit>[:<split>] (docs/datasets.md)"
    )
    batch_size: int = setting(
        gt=0, doc="conversations per optimiser step, across all GPUs (the global batch)"
    )
    renderer: str = setting("chat_template", choices=RENDERERS, doc="how messages become ids")
    train_on: str = setting(
        TrainOnWhat.ALL_ASSISTANT_MESSAGES.value,
        choices=[t.value for t in TrainOnWhat],
        doc="which assistant tokens are supervised",
    )
    weight_decay: float = setting(0.0, ge=0, doc="AdamW weight decay")
    eval: EvalSpec | None = setting(None, doc="greedy evaluation before and after training")
    validated_on: str = setting("", doc="where the profile was last run (free text)")

    def check(self) -> str | None:
        return batch_problem(self.training, self.batch_size, self.n_gpus, "batch_size")

    @property
    def dataset_path(self) -> Path:
        return (self.recipe_dir / self.dataset).resolve()

    def conversations(self) -> list[list[dict[str, Any]]]:
        """The training conversations of ``dataset``, through ``datasets``."""
        return load_conversations(self.dataset, self.recipe_dir)

    @property
    def train_on_what(self) -> TrainOnWhat:
        return TrainOnWhat(self.train_on)

    def sub_jobs(self) -> list:
        """The sub-jobs of this journey's job: the trainer, and the sampler that evaluates
        (it mirrors a LoRA trainer's adapter, so the sync before the last eval sends only the
        adapter: :attr:`weight_format`)."""
        return self.trainer_and_sampler(self.batch_size, weight_decay=self.weight_decay)

    @property
    def weight_format(self) -> str:
        """How the trained weights reach the sampler: ``lora`` (the adapter) for a LoRA
        trainer, as hosted Cortex syncs one, else ``hf`` (the full weights)."""
        return "lora" if (self.training or {}).get("peft_config") else "hf"

    def training_sub_job(self):
        return self.sub_jobs()[0]


def load_profile(path: str | Path, overrides: Sequence[str] = ()) -> SFTProfile:
    """The typed profile in ``path``, with ``key=value`` ``overrides`` applied."""
    path = Path(path)
    profile, raw = profiles.load(SFTProfile, path, overrides)
    return replace(profile, path=path, raw=raw)


def load_conversations(
    source: str | Path, base_dir: Path | None = None, *, field: str = "dataset"
) -> list[list[dict[str, Any]]]:
    """One conversation per row of ``source``'s ``messages`` column, loaded through
    ``datasets`` (:mod:`cortex_recipes.data`: a local JSON/JSONL/Parquet file relative to
    ``base_dir``, or a pinned Hub id). A message's keys that are null (Arrow fills the keys
    other rows' messages have) are dropped."""
    from cortex_recipes.data import load_records, messages_column

    base = Path(base_dir) if base_dir is not None else Path.cwd()
    rows = load_records(field, str(source), base, {"messages": messages_column})
    return [
        [{k: v for k, v in message.items() if v is not None} for message in row["messages"]]
        for row in rows
    ]


def batches(n_examples: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """Example indices per step: seeded shuffled epochs, concatenated; deterministic."""
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < batch_size * steps:
        epoch = list(range(n_examples))
        rng.shuffle(epoch)
        order.extend(epoch)
    return [order[i * batch_size : (i + 1) * batch_size] for i in range(steps)]
