"""The ``processing`` block a training or forward frame carries: which loss (``loss_fn``), its
config with every default filled in, and the post-processors, normalised into
:class:`Processing`, which the worker trusts (:mod:`cortex_recipes.local.processors` computes
what it names). Unknown keys and keys the hosted service knows but this backend does not
implement are refused naming them. The ``grpo`` keys and their defaults are
:mod:`cortex_recipes.grpo_loss`'s, the journeys' own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cortex_recipes.grpo_loss import DEFAULTS as GRPO_DEFAULTS
from cortex_recipes.grpo_loss import LOSS_AGG_MODES
from cortex_recipes.local.bodies import integer, number
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.specs import (
    abridge,
)

POST_PROCESSORS = ("compute_logprobs",)
LOSS_FNS = ("causal_cross_entropy", "grpo")
CAUSAL_CE_KEYS = {"batch_num_tokens", "dp_size", "global_batch_size"}
# Keys the hosted `grpo` knows that change the loss in ways the local backend does not implement.
GRPO_UNSUPPORTED = {
    "c_clip", "behav_imp_weight_cap", "m2_threshold", "use_sapo_loss", "sapo_tau_pos",
    "sapo_tau_neg", "use_decoupled_loss", "use_cispo_loss", "is_weight_clip_max",
    "use_kl_loss", "kl_loss_coef", "kl_loss_type",
}  # fmt: skip


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


def _config_number(config: dict, key: str, *, minimum: float | None = None) -> float | None:
    return number(config.get(key), f"processing.config.{key}", minimum=minimum, allow_none=True)


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
    if loss_fn == "causal_cross_entropy":
        _validate_causal_ce_config(config)
    elif loss_fn == "grpo":
        config = _validate_grpo_config(config)
    elif config:
        raise BackendError("processing.config is only accepted together with a loss_fn")
    return Processing(loss_fn=loss_fn, post=tuple(post), config=dict(config))


def _validate_global_scale(config: dict) -> None:
    dp = config.get("dp_size")
    if dp is not None:
        integer(dp, "processing.config.dp_size", minimum=1)
    bnt = _config_number(config, "batch_num_tokens", minimum=0)
    if dp is not None and bnt is None:
        raise BackendError("processing.config.dp_size requires processing.config.batch_num_tokens")
    if config.get("global_batch_size") is not None:
        integer(config["global_batch_size"], "processing.config.global_batch_size", minimum=1)


def _validate_causal_ce_config(config: dict) -> None:
    unknown = set(config) - CAUSAL_CE_KEYS
    if unknown:
        raise BackendError(
            f"processing.config has unknown keys {sorted(unknown)} for loss_fn "
            f"'causal_cross_entropy'; accepted: {', '.join(sorted(CAUSAL_CE_KEYS))}"
        )
    _validate_global_scale(config)


def _validate_grpo_config(config: dict) -> dict:
    unsupported = set(config) & GRPO_UNSUPPORTED
    if unsupported:
        raise BackendError(
            f"processing.config keys {sorted(unsupported)} are not supported by the local "
            f"backend's grpo; accepted: {', '.join(sorted(GRPO_DEFAULTS))}"
        )
    unknown = set(config) - set(GRPO_DEFAULTS)
    if unknown:
        raise BackendError(
            f"processing.config has unknown keys {sorted(unknown)} for loss_fn 'grpo'; "
            f"accepted: {', '.join(sorted(GRPO_DEFAULTS))}"
        )
    merged = {**GRPO_DEFAULTS, **config}
    number(merged["eps_clip"], "processing.config.eps_clip", minimum=0.0)
    _config_number(merged, "eps_clip_higher", minimum=0.0)
    _config_number(merged, "entropy_coeff")
    tau = number(merged["teacher_tau"], "processing.config.teacher_tau", minimum=0.0)
    clip = _config_number(merged, "teacher_clip", minimum=0.0)
    _config_number(merged, "teacher_clip_negative", minimum=0.0)
    if tau > 0 and not clip:
        raise BackendError(
            f"processing.config.teacher_tau={tau} requires a finite positive teacher_clip, "
            f"got teacher_clip={clip!r}"
        )
    if merged["loss_agg_mode"] not in LOSS_AGG_MODES:
        raise BackendError(
            f"processing.config.loss_agg_mode={abridge(merged['loss_agg_mode'])}; "
            f"accepted: {', '.join(LOSS_AGG_MODES)}"
        )
    if merged["importance_sampling_level"] != "token":
        raise BackendError(
            f"processing.config.importance_sampling_level="
            f"{abridge(merged['importance_sampling_level'])}; the local backend accepts only 'token'"
        )
    if merged["prox_logp_method"] != "recompute":
        raise BackendError(
            f"processing.config.prox_logp_method={abridge(merged['prox_logp_method'])}; "
            f"the local backend accepts only 'recompute'"
        )
    if merged["current_version"] is not None:
        integer(merged["current_version"], "processing.config.current_version", minimum=0)
    _validate_global_scale(merged)
    return merged
