"""The local backend's loss registry: one entry per ``loss_fn`` (``causal_cross_entropy``,
``grpo``), and the one place a loss name is spelled in the backend.

Each :class:`Loss` holds everything the backend needs to know about a loss:

- ``defaults``: every config key it accepts, at the hosted service's default;
- ``check_config``: the config with defaults filled in, or a :class:`BackendError` naming the
  key, the value and what is accepted (:mod:`cortex_recipes.local.loss_schemas` calls it);
- ``required_context`` / ``optional_context`` and ``check_context``: the context tensors a
  frame must or may carry, and the rules that depend on the config
  (:mod:`cortex_recipes.local.frame_checks` calls it);
- ``with_entropy``: whether the worker computes per-token entropy for it;
- ``compute``: ``(logprobs, entropy, context, config) -> (loss, metrics)``, with ``metrics``
  naming what it may report.

What hosted Cortex documents for ``grpo`` and this backend cannot compute is refused naming the
key (:data:`GRPO_UNSUPPORTED`): only ``kl_loss_type="full"`` (it needs the full reference
distribution, which a frame does not carry).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cortex_recipes import grpo_loss
from cortex_recipes.local import grpo as grpo_math
from cortex_recipes.local.bodies import integer, number
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.processors import causal_cross_entropy
from cortex_recipes.local.specs import abridge

Compute = Callable[
    [torch.Tensor, "torch.Tensor | None", dict, dict], tuple[torch.Tensor, dict[str, float]]
]


@dataclass(frozen=True)
class Loss:
    name: str
    defaults: dict[str, Any]
    check_config: Callable[[dict], dict]
    required_context: tuple[str, ...]
    optional_context: tuple[str, ...]
    check_context: Callable[[dict, dict[str, torch.Tensor], torch.Tensor], None]
    with_entropy: bool
    compute: Compute
    metrics: tuple[str, ...]


def _number(config: dict, key: str, *, minimum: float | None = None) -> float | None:
    return number(config.get(key), f"processing.config.{key}", minimum=minimum, allow_none=True)


def _choice(config: dict, key: str, accepted: tuple[str, ...]) -> None:
    if config[key] not in accepted:
        raise BackendError(
            f"processing.config.{key}={abridge(config[key])}; accepted: {', '.join(accepted)}"
        )


def _flag(config: dict, key: str) -> bool:
    if not isinstance(config[key], bool):
        raise BackendError(f"processing.config.{key}={abridge(config[key])} must be true or false")
    return config[key]


def _check_global_scale(config: dict) -> None:
    dp = config.get("dp_size")
    if dp is not None:
        integer(dp, "processing.config.dp_size", minimum=1)
    bnt = _number(config, "batch_num_tokens", minimum=0)
    if dp is not None and bnt is None:
        raise BackendError("processing.config.dp_size requires processing.config.batch_num_tokens")
    if config.get("global_batch_size") is not None:
        integer(config["global_batch_size"], "processing.config.global_batch_size", minimum=1)


def _unknown(config: dict, accepted: dict | set, name: str) -> None:
    unknown = set(config) - set(accepted)
    if unknown:
        raise BackendError(
            f"processing.config has unknown keys {sorted(unknown)} for loss_fn {name!r}; "
            f"accepted: {', '.join(sorted(accepted))}"
        )


# ---------------------------------------------------------------------------------------------
# causal_cross_entropy
# ---------------------------------------------------------------------------------------------

CAUSAL_CE_DEFAULTS: dict[str, Any] = {
    "batch_num_tokens": None,
    "dp_size": None,
    "global_batch_size": None,
}


def _check_causal_ce_config(config: dict) -> dict:
    _unknown(config, CAUSAL_CE_DEFAULTS, "causal_cross_entropy")
    _check_global_scale(config)
    return dict(config)


def _check_causal_ce_context(config: dict, context: dict, weighted: torch.Tensor) -> None:
    if "action_masks" in context:
        raise BackendError("loss_fn 'causal_cross_entropy' rejects context.action_masks")


def _causal_ce(logprobs, entropy, context, config):
    return causal_cross_entropy(logprobs, context, config)


# ---------------------------------------------------------------------------------------------
# grpo
# ---------------------------------------------------------------------------------------------

# Keys hosted documents that this backend cannot compute (with the reason).
GRPO_UNSUPPORTED: dict[str, str] = {}
GRPO_UNSUPPORTED_VALUES = {
    ("kl_loss_type", "full"): "it needs the reference model's full distribution, which a frame "
    "does not carry",
}


def _check_grpo_config(config: dict) -> dict:
    _unknown(config, grpo_loss.DEFAULTS, "grpo")
    merged = {**grpo_loss.DEFAULTS, **config}
    number(merged["eps_clip"], "processing.config.eps_clip", minimum=0.0)
    _number(merged, "eps_clip_higher", minimum=0.0)
    _number(merged, "entropy_coeff")
    tau = number(merged["teacher_tau"], "processing.config.teacher_tau", minimum=0.0)
    clip = _number(merged, "teacher_clip", minimum=0.0)
    _number(merged, "teacher_clip_negative", minimum=0.0)
    if tau > 0 and not clip:
        raise BackendError(
            f"processing.config.teacher_tau={tau} requires a finite positive teacher_clip, "
            f"got teacher_clip={clip!r}"
        )
    for key in ("use_decoupled_loss", "use_cispo_loss", "use_sapo_loss", "use_kl_loss"):
        _flag(merged, key)
    _choice(merged, "loss_agg_mode", grpo_loss.LOSS_AGG_MODES)
    _choice(merged, "importance_sampling_level", grpo_loss.IMPORTANCE_SAMPLING_LEVELS)
    _choice(merged, "prox_logp_method", grpo_loss.PROX_LOGP_METHODS)
    for (key, value), why in GRPO_UNSUPPORTED_VALUES.items():
        if merged[key] == value:
            raise BackendError(
                f"processing.config.{key}={value!r} is not supported by the local backend: {why}; "
                f"accepted: {', '.join(grpo_loss.KL_LOSS_TYPES)}"
            )
    _choice(merged, "kl_loss_type", grpo_loss.KL_LOSS_TYPES)
    c_clip = _number(merged, "c_clip")
    if c_clip is not None and c_clip <= 1:
        raise BackendError(f"processing.config.c_clip={c_clip} must be > 1 (dual clip)")
    cap = _number(merged, "behav_imp_weight_cap")
    if cap is not None and cap <= 0:
        raise BackendError(f"processing.config.behav_imp_weight_cap={cap} must be > 0")
    _number(merged, "m2_threshold", minimum=0.0)
    weight_max = _number(merged, "is_weight_clip_max")
    if weight_max is not None and weight_max <= 0:
        raise BackendError(f"processing.config.is_weight_clip_max={weight_max} must be > 0")
    for key in ("sapo_tau_pos", "sapo_tau_neg"):
        value = number(merged[key], f"processing.config.{key}")
        if not value > 0:
            raise BackendError(f"processing.config.{key}={value} must be > 0")
    _number(merged, "kl_loss_coef")
    if merged["current_version"] is not None:
        integer(merged["current_version"], "processing.config.current_version", minimum=0)
    _check_grpo_combinations(merged)
    _check_global_scale(merged)
    return merged


def _check_grpo_combinations(c: dict) -> None:
    if c["use_cispo_loss"] and c["use_sapo_loss"]:
        raise BackendError(
            "processing.config.use_cispo_loss and use_sapo_loss are both true; choose one "
            "surrogate (or neither, for the PPO clip)"
        )
    if c["c_clip"] is not None and (c["use_cispo_loss"] or c["use_sapo_loss"]):
        raise BackendError(
            f"processing.config.c_clip={c['c_clip']} is a PPO-clip term; it does not combine "
            f"with use_cispo_loss or use_sapo_loss"
        )
    if c["behav_imp_weight_cap"] is not None and not c["use_decoupled_loss"]:
        raise BackendError(
            f"processing.config.behav_imp_weight_cap={c['behav_imp_weight_cap']} acts only with "
            f"use_decoupled_loss=true (the behaviour weight is exp(prox - old))"
        )
    if c["is_weight_clip_max"] is not None and not c["use_cispo_loss"]:
        raise BackendError(
            f"processing.config.is_weight_clip_max={c['is_weight_clip_max']} acts only with "
            f"use_cispo_loss=true"
        )
    if c["teacher_tau"] > 0 and c["importance_sampling_level"] != "token":
        raise BackendError(
            "processing.config.teacher_tau > 0 requires importance_sampling_level='token', got "
            f"{c['importance_sampling_level']!r}"
        )
    needs_versions = c["use_decoupled_loss"] and c["prox_logp_method"] in ("loglinear", "metrics")
    if needs_versions and c["current_version"] is None:
        raise BackendError(
            f"processing.config.prox_logp_method={c['prox_logp_method']!r} with "
            f"use_decoupled_loss=true requires processing.config.current_version"
        )


def _scored_finite(context: dict, key: str, weighted: torch.Tensor) -> None:
    value = context[key]
    if not value.is_floating_point():
        raise BackendError(f"context.{key} must be a float tensor")
    bad = weighted & ~torch.isfinite(value)
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise BackendError(
            f"context.{key} is non-finite at row {row}, position {col}, where loss_mask > 0"
        )


def _require(context: dict, key: str, why: str) -> None:
    if key not in context:
        raise BackendError(f"{why} requires context.{key}")


def _check_grpo_context(config: dict, context: dict, weighted: torch.Tensor) -> None:
    _require(context, "advantages", "loss_fn 'grpo'")
    if config.get("teacher_tau", 0) > 0:
        _require(context, "teacher_log_probs_shifted", "processing.config.teacher_tau > 0")
        _scored_finite(context, "teacher_log_probs_shifted", weighted)
    if config["use_kl_loss"]:
        _require(context, "ref_log_probs_shifted", "processing.config.use_kl_loss=true")
        _scored_finite(context, "ref_log_probs_shifted", weighted)
    if "prox_logp_shifted" in context:
        _scored_finite(context, "prox_logp_shifted", weighted)
    if config["use_decoupled_loss"]:
        method = config["prox_logp_method"]
        why = f"processing.config.prox_logp_method={method!r} with use_decoupled_loss=true"
        if method == "metrics":
            _require(context, "prox_logp_shifted", why)
        if method == "metrics" or (method == "loglinear" and "prox_logp_shifted" not in context):
            _require(context, "versions", why)
    if config["loss_agg_mode"] == "prompt-mean":
        _require(context, "prompt_group_ids", "processing.config.loss_agg_mode='prompt-mean'")
        groups = context["prompt_group_ids"]
        if bool((groups != groups[:, :1]).any()):
            row = int((groups != groups[:, :1]).any(-1).nonzero()[0])
            raise BackendError(
                f"context.prompt_group_ids differs within row {row}; a row belongs to one group"
            )


GRPO_METRICS = (
    "grpo_stats_token_count", "clip_ratio", "approx_kl", "importance_weight", "advantage_mean",
    "entropy", "grpo_importance_weight_sum", "grpo_log_ratio_sum", "grpo_clipped_token_count",
    "grpo_entropy_sum", "dual_clip_ratio", "behave_imp_weight", "behave_masked_fraction",
    "m2_masked_fraction", "cispo_weight_mean", "sapo_gate_mean", "kl_loss", "staleness_mean",
    "staleness_max", "prox_loglinear_abs_error", "prox_loglinear_imp_weight_error",
    "teacher_tau", "teacher_term_token_count", "teacher_log_ratio_sum",
    "teacher_clipped_log_ratio_sum", "teacher_clipped_fraction", "teacher_advantage_sum",
)  # fmt: skip

REGISTRY: dict[str, Loss] = {
    loss.name: loss
    for loss in (
        Loss(
            name="causal_cross_entropy",
            defaults=CAUSAL_CE_DEFAULTS,
            check_config=_check_causal_ce_config,
            required_context=("loss_mask",),
            optional_context=("input_ids", "labels", "advantages"),
            check_context=_check_causal_ce_context,
            with_entropy=False,
            compute=_causal_ce,
            metrics=("loss_weight_sum", "loss_token_count"),
        ),
        Loss(
            name="grpo",
            defaults=grpo_loss.DEFAULTS,
            check_config=_check_grpo_config,
            required_context=("loss_mask", "advantages"),
            optional_context=(
                "input_ids",
                "labels",
                "old_log_probs_shifted",
                "prox_logp_shifted",
                "versions",
                "ref_log_probs_shifted",
                "teacher_log_probs_shifted",
                "prompt_group_ids",
                "action_masks",
                "temperature",
            ),  # fmt: skip
            check_context=_check_grpo_context,
            with_entropy=True,
            compute=grpo_math.grpo,
            metrics=GRPO_METRICS,
        ),
    )
}
LOSS_FNS = tuple(REGISTRY)


def get(name: str) -> Loss:
    return REGISTRY[name]


def rank_mean_loss(
    loss_fn: str,
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    context: dict[str, torch.Tensor],
    config: dict,
    *,
    ranks: int = 1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one forward-backward as ``ranks`` data-parallel ranks compute it.

    With one rank, ``loss_fn`` over the whole batch. With more (hosted-conformance rule
    ``data-parallel-means``), the rows are split into ``ranks`` contiguous shards as evenly as
    they go, each shard's loss is its own local value (a token mean over its rows, unless the
    config's ``dp_size`` and ``batch_num_tokens`` scale it globally), and the loss is the mean of
    the shards' losses, the gradient DeepSpeed's all-reduce averages. Metrics are the whole
    batch's (computed without a graph).
    """
    compute = REGISTRY[loss_fn].compute
    if ranks <= 1:
        return compute(logprobs, entropy, context, config)
    with torch.no_grad():
        _, metrics = compute(logprobs, entropy, context, config)
    rows = logprobs.shape[0]
    shards = torch.tensor_split(torch.arange(rows), ranks)

    def part(value, index):
        if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == rows:
            return value[index]
        return value

    losses = [
        compute(
            logprobs[index],
            None if entropy is None else entropy[index],
            {key: part(value, index) for key, value in context.items()},
            config,
        )[0]
        for index in shards
    ]
    return torch.stack(losses).mean(), metrics
