"""Loss functions and post-processors the local backend runs on a forward pass.

Names and semantics follow the Cortex Training ``processing`` contract (``loss_fn``, ``post``,
``config``) as the public Arctic-Platform processors define them; this is an independent
implementation. Every ``*_shifted`` tensor and ``loss_mask`` is prediction-aligned: column ``i``
scores token ``i + 1``.

Config validation is strict: unknown names and keys raise :class:`BackendError` naming the key
and the accepted set, before any tensor work happens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from cortex_recipes.local.errors import BackendError

POST_PROCESSORS = ("compute_logprobs",)
LOSS_FNS = ("causal_cross_entropy", "grpo")

CAUSAL_CE_KEYS = {"batch_num_tokens", "dp_size", "global_batch_size"}
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
GRPO_DEFAULTS: dict[str, Any] = {
    "eps_clip": 0.2,
    "eps_clip_higher": None,
    "loss_agg_mode": "token-mean",
    "entropy_coeff": 0.0,
    "teacher_tau": 0.0,
    "teacher_clip": None,
    "teacher_clip_negative": None,
    "dp_size": None,
    "batch_num_tokens": None,
    "global_batch_size": None,
    "importance_sampling_level": "token",
    "prox_logp_method": "recompute",
    "current_version": None,
}
# Keys the hosted `grpo` knows that change the loss in ways the local backend does not implement.
GRPO_UNSUPPORTED = {
    "c_clip", "behav_imp_weight_cap", "m2_threshold", "use_sapo_loss", "sapo_tau_pos",
    "sapo_tau_neg", "use_decoupled_loss", "use_cispo_loss", "is_weight_clip_max",
    "use_kl_loss", "kl_loss_coef", "kl_loss_type",
}  # fmt: skip
CONTEXT_TENSOR_KEYS = {
    "input_ids",
    "loss_mask",
    "advantages",
    "labels",
    "old_log_probs_shifted",
    "teacher_log_probs_shifted",
    "action_masks",
    "temperature",
    "versions",
}


@dataclass(frozen=True)
class Processing:
    """A validated ``processing`` block."""

    loss_fn: str | None
    post: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)


def _number(config: dict, key: str, *, minimum: float | None = None, allow_none: bool = True):
    value = config.get(key)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BackendError(f"processing.config.{key}={value!r} must be a finite number")
    if minimum is not None and value < minimum:
        raise BackendError(f"processing.config.{key}={value!r} must be >= {minimum}")
    return value


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
            f"processing.loss_fn={loss_fn!r} is not registered; accepted: {', '.join(LOSS_FNS)}"
        )
    post = block.get("post") or []
    if not isinstance(post, list) or not all(isinstance(p, str) for p in post):
        raise BackendError(f"processing.post={post!r} must be a list of names")
    for name in post:
        if name not in POST_PROCESSORS:
            raise BackendError(
                f"processing.post contains {name!r}, which is not registered; "
                f"accepted: {', '.join(POST_PROCESSORS)}"
            )
    config = block.get("config") or {}
    if not isinstance(config, dict):
        raise BackendError(f"processing.config={config!r} must be an object")
    if loss_fn == "causal_cross_entropy":
        _validate_causal_ce_config(config)
    elif loss_fn == "grpo":
        config = _validate_grpo_config(config)
    elif config:
        raise BackendError("processing.config is only accepted together with a loss_fn")
    return Processing(loss_fn=loss_fn, post=tuple(post), config=config)


def _validate_global_scale(config: dict) -> None:
    dp = config.get("dp_size")
    bnt = config.get("batch_num_tokens")
    if dp is not None and (isinstance(dp, bool) or not isinstance(dp, int) or dp <= 0):
        raise BackendError(f"processing.config.dp_size={dp!r} must be a positive integer")
    if bnt is not None and (isinstance(bnt, bool) or not isinstance(bnt, int | float) or bnt < 0):
        raise BackendError(f"processing.config.batch_num_tokens={bnt!r} must be >= 0")
    if dp is not None and bnt is None:
        raise BackendError("processing.config.dp_size requires processing.config.batch_num_tokens")


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
    _number(merged, "eps_clip", minimum=0.0, allow_none=False)
    _number(merged, "eps_clip_higher", minimum=0.0)
    _number(merged, "entropy_coeff")
    tau = _number(merged, "teacher_tau", minimum=0.0, allow_none=False)
    clip = _number(merged, "teacher_clip", minimum=0.0)
    _number(merged, "teacher_clip_negative", minimum=0.0)
    if tau > 0 and not clip:
        raise BackendError(
            f"processing.config.teacher_tau={tau} requires a finite positive teacher_clip, "
            f"got teacher_clip={clip!r}"
        )
    if merged["loss_agg_mode"] not in LOSS_AGG_MODES:
        raise BackendError(
            f"processing.config.loss_agg_mode={merged['loss_agg_mode']!r}; "
            f"accepted: {', '.join(LOSS_AGG_MODES)}"
        )
    if merged["importance_sampling_level"] != "token":
        raise BackendError(
            f"processing.config.importance_sampling_level="
            f"{merged['importance_sampling_level']!r}; the local backend accepts only 'token'"
        )
    if merged["prox_logp_method"] != "recompute":
        raise BackendError(
            f"processing.config.prox_logp_method={merged['prox_logp_method']!r}; "
            f"the local backend accepts only 'recompute'"
        )
    _validate_global_scale(merged)
    return merged


def validate_context(
    processing: Processing, context: Any, input_ids: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Check context tensors against the loss's needs and the batch shape (no model needed)."""
    if context is None:
        context = {}
    if not isinstance(context, dict):
        raise BackendError(f"context must be an object, got {type(context).__name__}")
    unknown = set(context) - CONTEXT_TENSOR_KEYS
    if unknown:
        raise BackendError(
            f"context has unknown keys {sorted(unknown)}; accepted: "
            f"{', '.join(sorted(CONTEXT_TENSOR_KEYS))}"
        )
    shape = tuple(input_ids.shape)
    for key, value in context.items():
        if not torch.is_tensor(value):
            raise BackendError(f"context.{key} must be a tensor, got {type(value).__name__}")
        if key in ("temperature",):
            continue
        if tuple(value.shape) != shape:
            raise BackendError(
                f"context.{key} has shape {list(value.shape)}; expected {list(shape)} "
                f"(the shape of kwargs.input_ids)"
            )
        finite_required = value.is_floating_point() and key != "teacher_log_probs_shifted"
        if finite_required and not torch.isfinite(value).all():
            raise BackendError(f"context.{key} contains non-finite values")
    if "input_ids" in context and not torch.equal(context["input_ids"].long(), input_ids.long()):
        raise BackendError("context.input_ids differs from kwargs.input_ids")
    loss_fn = processing.loss_fn
    if loss_fn in ("causal_cross_entropy", "grpo") and "loss_mask" not in context:
        raise BackendError(f"loss_fn {loss_fn!r} requires context.loss_mask")
    if loss_fn == "causal_cross_entropy":
        if "action_masks" in context:
            raise BackendError("loss_fn 'causal_cross_entropy' rejects context.action_masks")
        temp = context.get("temperature")
        if temp is not None and not torch.all(temp == 1):
            raise BackendError("loss_fn 'causal_cross_entropy' requires temperature 1 (or none)")
        labels = context.get("labels")
        if labels is not None and bool(((labels == -100) & (context["loss_mask"] > 0)).any()):
            raise BackendError("context.labels is -100 at a position where loss_mask > 0")
        if bool((context["loss_mask"] < 0).any()):
            raise BackendError("context.loss_mask has negative weights")
    if loss_fn == "grpo":
        if "advantages" not in context:
            raise BackendError("loss_fn 'grpo' requires context.advantages")
        if processing.config.get("teacher_tau", 0) > 0:
            teacher = context.get("teacher_log_probs_shifted")
            if teacher is None:
                raise BackendError(
                    "processing.config.teacher_tau > 0 requires context.teacher_log_probs_shifted"
                )
            if not teacher.is_floating_point():
                raise BackendError("context.teacher_log_probs_shifted must be a float tensor")
            scored = context["loss_mask"] > 0
            bad = scored & ~torch.isfinite(teacher)
            if bool(bad.any()):
                row, col = (int(i) for i in bad.nonzero()[0])
                raise BackendError(
                    f"context.teacher_log_probs_shifted is non-finite at row {row}, "
                    f"position {col}, where loss_mask > 0"
                )
    return context


# ---------------------------------------------------------------------------------------------
# Tensor math
# ---------------------------------------------------------------------------------------------


def shifted_labels(input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token targets: column ``i`` holds ``input_ids[:, i + 1]`` (the last column wraps)."""
    return labels if labels is not None else torch.roll(input_ids, shifts=-1, dims=-1)


def token_logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, *, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 log-probabilities of ``targets`` (-100 -> 0) and, if asked, per-token entropy."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    safe = targets.clamp(min=0).long()
    out = logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    out = out.masked_fill(targets == -100, 0.0)
    entropy = None
    if with_entropy:
        entropy = -(logp.exp() * logp).sum(-1)
    return out, entropy


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def causal_cross_entropy(
    logprobs: torch.Tensor, context: dict[str, torch.Tensor], config: dict
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted next-token NLL: ``sum(-logprob * w) / sum(w)`` (or globally normalised)."""
    weights = context["loss_mask"].to(logprobs.dtype)
    scored = weights > 0
    if bool((scored & ~torch.isfinite(logprobs)).any()):
        raise BackendError("non-finite logprobs at a position where loss_mask > 0")
    nll = _masked_sum(-logprobs.masked_fill(~scored, 0.0), weights)
    if config.get("batch_num_tokens") is not None:
        denom = float(config["batch_num_tokens"]) / float(config.get("dp_size") or 1)
    else:
        denom = float(weights.sum())
    loss = nll / denom if denom > 0 else logprobs.sum() * 0.0
    return loss, {"loss_weight_sum": float(weights.sum()), "loss_token_count": int(scored.sum())}


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, config: dict) -> torch.Tensor:
    mode = config["loss_agg_mode"]
    if mode == "token-mean":
        if config.get("batch_num_tokens") is not None:
            denom = float(config["batch_num_tokens"]) / float(config.get("dp_size") or 1)
        else:
            denom = float(mask.sum())
        return _masked_sum(per_token, mask) / denom if denom > 0 else per_token.sum() * 0.0
    row_sums = (per_token * mask).sum(-1)
    row_counts = mask.sum(-1)
    rows = row_counts > 0
    if not bool(rows.any()):
        return per_token.sum() * 0.0
    if mode == "seq-mean-token-mean":
        return (row_sums[rows] / row_counts[rows]).mean()
    if mode == "seq-mean-token-sum":
        return row_sums[rows].mean()
    # seq-mean-token-sum-norm: token sums normalised by the padded length (Dr. GRPO style).
    return row_sums[rows].sum() / (rows.sum() * per_token.shape[-1])


def grpo(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    context: dict[str, torch.Tensor],
    config: dict,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clipped policy-gradient loss with optional teacher (on-policy distillation) terms."""
    mask = (context["loss_mask"] > 0).to(logprobs.dtype)
    advantages = context["advantages"].to(logprobs.dtype)
    old = context.get("old_log_probs_shifted")
    old = logprobs.detach() if old is None else old.to(logprobs.dtype)
    metrics: dict[str, float] = {}
    n_tokens = float(mask.sum())

    tau = float(config["teacher_tau"])
    if tau > 0:
        teacher = context["teacher_log_probs_shifted"].to(logprobs.dtype)
        clip_pos = float(config["teacher_clip"])
        clip_neg = float(config["teacher_clip_negative"] or clip_pos)
        scored = mask > 0
        log_ratio = torch.where(scored, teacher - logprobs.detach(), torch.zeros_like(logprobs))
        clipped = log_ratio.clamp(-clip_neg, clip_pos)
        advantages = advantages + tau * clipped * mask
        was_clipped = (log_ratio != clipped) & scored
        metrics.update(
            teacher_tau=tau,
            teacher_term_token_count=n_tokens,
            teacher_log_ratio_sum=float(log_ratio.sum()),
            teacher_clipped_log_ratio_sum=float(clipped.sum()),
            teacher_clipped_fraction=float(was_clipped.sum()) / n_tokens if n_tokens else 0.0,
            teacher_advantage_sum=float((tau * clipped * mask).sum()),
        )

    eps_low = float(config["eps_clip"])
    eps_high = float(
        config["eps_clip_higher"] if config["eps_clip_higher"] is not None else eps_low
    )
    log_ratio = (logprobs - old) * mask
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped_obj = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped_obj)
    loss = _aggregate(per_token, mask, config)
    coeff = float(config["entropy_coeff"])
    if coeff and entropy is not None:
        loss = loss - coeff * _aggregate(entropy, mask, config)

    with torch.no_grad():
        clip_active = (clipped_obj > unclipped) & (mask > 0)
        lr = log_ratio.detach()
        approx_kl = (torch.exp(-lr) - 1 + lr) * mask  # k3 estimator of KL(pi_old || pi)
        denom = n_tokens or 1.0
        metrics.update(
            grpo_stats_token_count=n_tokens,
            clip_ratio=float(clip_active.sum()) / denom,
            approx_kl=float(approx_kl.sum()) / denom,
            importance_weight=float((ratio.detach() * mask).sum()) / denom,
            advantage_mean=float((advantages * mask).sum()) / denom,
        )
        if entropy is not None:
            metrics["entropy"] = float((entropy * mask).sum()) / denom
    return loss, metrics
