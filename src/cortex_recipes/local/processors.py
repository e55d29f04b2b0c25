"""Loss functions and post-processors the local backend runs on a forward pass (tensor math only).

Names and semantics follow the Cortex Training ``processing`` contract (``loss_fn``, ``post``,
``config``) as the public Arctic-Platform processors define them; this is an independent
implementation. Every ``*_shifted`` tensor and ``loss_mask`` is prediction-aligned: column ``i``
scores token ``i + 1``.

Inputs arrive already checked by :mod:`cortex_recipes.local.frame_checks` and :mod:`~cortex_recipes.local.loss_schemas` (config keys, shapes,
dtypes, ranges); ``config`` has every default filled in. The one check left here is the one only
the model can fail: a non-finite log-probability where a token is scored.
"""

from __future__ import annotations

from typing import Any

import torch

from cortex_recipes.grpo_loss import teacher_clip_bounds
from cortex_recipes.local.errors import BackendError


def shifted_labels(input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token targets: column ``i`` holds ``input_ids[:, i + 1]`` (the last column wraps)."""
    return labels if labels is not None else torch.roll(input_ids, shifts=-1, dims=-1)


def temperature_divisor(temperature: Any, shape: tuple[int, ...]) -> torch.Tensor | float | None:
    """A validated temperature (scalar, [B], [B, 1] or [B, T]) shaped to divide [B, T, V] logits."""
    if temperature is None:
        return None
    if not torch.is_tensor(temperature):
        return None if float(temperature) == 1.0 else float(temperature)
    t = temperature.float()
    if bool((t == 1).all()):
        return None
    if t.dim() == 0:
        return float(t)
    if t.dim() == 1:
        t = t.unsqueeze(-1)
    return t.expand(shape[0], shape[1]).unsqueeze(-1)


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    with_entropy: bool,
    temperature: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 log-probabilities of ``targets`` (-100 -> 0) and, if asked, per-token entropy.

    With a ``temperature`` other than 1, logits are divided by it first (the sampler's
    distribution at that temperature).
    """
    scaled = logits.float()
    divisor = temperature_divisor(temperature, tuple(targets.shape))
    if divisor is not None:
        scaled = scaled / (divisor.to(scaled.device) if torch.is_tensor(divisor) else divisor)
    logp = torch.log_softmax(scaled, dim=-1)
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
        clip_neg, clip_pos = teacher_clip_bounds(config)
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


def _loss(
    loss_fn: str, logprobs: torch.Tensor, entropy: torch.Tensor | None, context: dict, config: dict
) -> tuple[torch.Tensor, dict[str, float]]:
    if loss_fn == "causal_cross_entropy":
        return causal_cross_entropy(logprobs, context, config)
    return grpo(logprobs, entropy, context, config)


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
    batch's.
    """
    loss, metrics = _loss(loss_fn, logprobs, entropy, context, config)
    if ranks <= 1:
        return loss, metrics
    rows = logprobs.shape[0]
    shards = torch.tensor_split(torch.arange(rows), ranks)

    def part(value, index):
        if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == rows:
            return value[index]
        return value

    losses = [
        _loss(
            loss_fn,
            logprobs[index],
            None if entropy is None else entropy[index],
            {key: part(value, index) for key, value in context.items()},
            config,
        )[0]
        for index in shards
    ]
    return torch.stack(losses).mean(), metrics
