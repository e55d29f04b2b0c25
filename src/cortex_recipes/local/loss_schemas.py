"""The ``processing`` block a training or forward frame carries: which loss (``loss_fn``), its
config with every default filled in, and the post-processors, normalised into
:class:`Processing`, which the worker trusts (:mod:`cortex_recipes.local.processors` computes
what it names). Unknown keys and keys the hosted service knows but this backend does not
implement are refused naming them. Each loss's keys, defaults and rules are its entry in
:mod:`cortex_recipes.local.losses` (the ``grpo`` keys are :mod:`cortex_recipes.grpo_loss`'s,
the journeys' own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cortex_recipes.local import losses
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.specs import (
    abridge,
)

POST_PROCESSORS = ("compute_logprobs",)
LOSS_FNS = losses.LOSS_FNS


@dataclass(frozen=True)
class Processing:
    """A validated ``processing`` block; ``config`` has every default filled in."""

    loss_fn: str | None
    post: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"loss_fn": self.loss_fn, "post": list(self.post), "config": self.config}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Processing:
        return cls(data["loss_fn"], tuple(data["post"]), dict(data["config"]))


def parse_processing(block: Any, *, require_loss: bool) -> Processing:
    """Validate a ``processing`` block; raise :class:`BackendError` naming what is wrong."""
    if block is None:
        if require_loss:
            raise BackendError("processing is required")
        return Processing(loss_fn=None, post=())
    if not isinstance(block, dict):
        raise BackendError(f"processing must be an object, got {type(block).__name__}")
    unknown = set(block) - {"loss_fn", "post", "config"}
    if unknown:
        raise BackendError(
            f"processing has unknown keys {sorted(unknown)}; accepted: loss_fn, post, config"
        )
    loss_fn = block.get("loss_fn")
    if loss_fn is None and require_loss:
        raise BackendError(f"processing.loss_fn is required; accepted: {', '.join(LOSS_FNS)}")
    if loss_fn is not None and loss_fn not in LOSS_FNS:
        raise BackendError(
            f"processing.loss_fn={abridge(loss_fn)} is not registered; "
            f"accepted: {', '.join(LOSS_FNS)}"
        )
    post = block.get("post") or []
    if not isinstance(post, list) or not all(isinstance(p, str) for p in post):
        raise BackendError(f"processing.post={abridge(post)} must be a list of names")
    for name in post:
        if name not in POST_PROCESSORS:
            raise BackendError(
                f"processing.post contains {abridge(name)}, which is not registered; "
                f"accepted: {', '.join(POST_PROCESSORS)}"
            )
    config = block.get("config") or {}
    if not isinstance(config, dict):
        raise BackendError(f"processing.config={abridge(config)} must be an object")
    if loss_fn is not None:
        config = losses.get(loss_fn).check_config(config)
    elif config:
        raise BackendError("processing.config is only accepted together with a loss_fn")
    return Processing(loss_fn=loss_fn, post=tuple(post), config=dict(config))
