"""Per-token logprobs, entropy and the ``causal_cross_entropy`` loss (tensor math only); the
``grpo`` loss is :mod:`cortex_recipes.local.grpo`, and :mod:`cortex_recipes.local.losses` is the
registry that names both.

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
