"""The ``grpo`` loss with every variant hosted Cortex documents (tensor math only).

Inputs are prediction-aligned [B, T] tensors (column ``i`` scores token ``i + 1``), already
checked by :mod:`cortex_recipes.local.frame_checks`; ``config`` is the full config
(:data:`cortex_recipes.grpo_loss.DEFAULTS` filled in, cross-key rules checked by
:mod:`cortex_recipes.local.losses`). Notation: ``logp`` the trained policy's logprobs (with
gradient), ``old`` the behaviour policy's (``old_log_probs_shifted``; absent: ``logp`` detached,
on-policy), ``prox`` the proximal policy's, ``A`` the per-token advantages, ``m`` the scored
tokens (``loss_mask > 0``). Per token, in order:

1. **Teacher term** (``teacher_tau > 0``): ``A += tau * clamp(teacher - logp.detach(),
   -teacher_clip_negative, teacher_clip)``.
2. **Proximal policy** (``use_decoupled_loss``): ``prox_logp_method="recompute"`` takes
   ``context.prox_logp_shifted`` (absent: ``old``, so the loss is plain PPO); ``"loglinear"``
   interpolates in log space between the behaviour policy (version ``v``, ``context.versions``)
   and the trained one (version ``c``, ``current_version``) to version ``c - 1``:
   ``prox = old + a * (logp.detach() - old)``, ``a = (c - 1 - v) / (c - v)`` clamped to [0, 1]
   (``a = 0`` where ``v >= c``); ``"metrics"`` trains on ``context.prox_logp_shifted`` and
   reports how far the loglinear estimate is from it. The anchor of the ratio is ``prox`` with
   the decoupled loss and ``old`` without.
3. **M2PO** (``m2_threshold``): over the scored tokens, ``d = anchor - old`` where the anchor is
   ``prox`` (decoupled) or ``logp.detach()``; while the mean of ``d**2`` exceeds the threshold,
   the token with the largest ``d**2`` leaves the mask (the fewest tokens that bring the
   second moment under it; ties by position).
4. **Ratio**: ``r = exp(logp - anchor)`` per token, or with
   ``importance_sampling_level="sequence"`` one ratio per row, ``exp`` of the row's mean log
   ratio over its scored tokens (GSPO), shared by the row's tokens.
5. **Surrogate** (one of):
   PPO: ``max(-A r, -A clamp(r, 1 - eps_clip, 1 + eps_clip_higher))``, with ``c_clip`` (> 1)
   a negative-advantage token's loss at most ``-A * c_clip`` (dual clip);
   CISPO (``use_cispo_loss``): ``-A * sg(min(r, cap)) * logp``, ``cap = is_weight_clip_max``
   or ``1 + eps_clip_higher``;
   SAPO (``use_sapo_loss``): ``-A * (4 / tau) * sigmoid(tau * (r - 1))``, ``tau`` =
   ``sapo_tau_pos`` where ``A > 0`` else ``sapo_tau_neg``.
6. **Behaviour weight** (decoupled): the surrogate times ``w = exp(prox - old)`` (no gradient);
   with ``behav_imp_weight_cap`` a token whose ``w`` exceeds the cap contributes 0 (it stays in
   the aggregation's count).
7. **Aggregation** (``loss_agg_mode``) over the mask: ``token-mean`` (sum over all tokens /
   their count, or / (``batch_num_tokens`` / ``dp_size``)), ``seq-mean-token-mean``,
   ``seq-mean-token-sum``, ``seq-mean-token-sum-norm`` (row sums / (rows x padded length)),
   ``prompt-mean`` (token mean within each ``context.prompt_group_ids`` group, then the mean
   over groups).
8. ``- entropy_coeff * agg(entropy)``, and with ``use_kl_loss``
   ``+ kl_loss_coef * agg(k(logp, ref))`` for ``d = logp - ref``: ``kl``/``k1`` ``d``, ``abs``
   ``|d|``, ``mse``/``k2`` ``d**2 / 2``, ``low_var_kl``/``k3`` ``exp(-d) + d - 1`` clamped to
   [-10, 10].

Semantics follow the published algorithms the hosted keys name (decoupled PPO and its
log-linear proximal approximation from AReaL, dual-clip PPO, M2PO, GSPO, CISPO, SAPO, the k1/k2/k3
KL estimators); the hosted service's source is not public, so where it differs in a detail the
docs (docs/local-backend.md) say which reading this is. An independent float64 reference checks
each variant (tests/unit/test_grpo_reference.py).
"""

from __future__ import annotations

import torch

from cortex_recipes.grpo_loss import teacher_clip_bounds


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, config: dict, groups: torch.Tensor | None = None
) -> torch.Tensor:
    """``per_token`` [B, T] reduced over ``mask`` as ``config["loss_agg_mode"]`` says."""
    mode = config["loss_agg_mode"]
    if mode == "token-mean":
        if config.get("batch_num_tokens") is not None:
            denom = float(config["batch_num_tokens"]) / float(config.get("dp_size") or 1)
        else:
            denom = float(mask.sum())
        return (per_token * mask).sum() / denom if denom > 0 else per_token.sum() * 0.0
    row_sums = (per_token * mask).sum(-1)
    row_counts = mask.sum(-1)
    rows = row_counts > 0
    if not bool(rows.any()):
        return per_token.sum() * 0.0
    if mode == "seq-mean-token-mean":
        return (row_sums[rows] / row_counts[rows]).mean()
    if mode == "seq-mean-token-sum":
        return row_sums[rows].mean()
    if mode == "prompt-mean":
        assert groups is not None, "prompt-mean needs context.prompt_group_ids"
        means = []
        for group in torch.unique(groups[rows]):
            members = rows & (groups == group)
            means.append(row_sums[members].sum() / row_counts[members].sum())
        return torch.stack(means).mean()
    # seq-mean-token-sum-norm: token sums normalised by the padded length (Dr. GRPO style).
    return row_sums[rows].sum() / (rows.sum() * per_token.shape[-1])


def _loglinear_prox(
    logp: torch.Tensor, old: torch.Tensor, versions: torch.Tensor, current: int
) -> torch.Tensor:
    v = versions.to(logp.dtype)
    gap = float(current) - v
    alpha = torch.where(gap > 0, (gap - 1) / gap.clamp(min=1), torch.zeros_like(v))
    return old + alpha.clamp(0.0, 1.0) * (logp.detach() - old)


def _m2_keep(d: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """The mask without the fewest largest-``d**2`` tokens that bring mean(d**2) <= threshold."""
    flat_mask = mask.flatten() > 0
    idx = torch.nonzero(flat_mask).flatten()
    if idx.numel() == 0:
        return mask
    sq = (d.flatten()[idx]).pow(2)
    n = sq.numel()
    order = torch.sort(sq, descending=True, stable=True).indices
    removed = torch.cat([sq.new_zeros(1), torch.cumsum(sq[order], 0)])  # sum of the k largest
    remaining = (sq.sum() - removed)[:n]  # k = 0 .. n-1 removed
    counts = torch.arange(n, 0, -1, dtype=sq.dtype)
    ok = torch.nonzero(remaining / counts <= threshold).flatten()
    k = int(ok[0]) if ok.numel() else n
    keep = mask.flatten().clone()
    keep[idx[order[:k]]] = 0
    return keep.view_as(mask)


def _kl_term(logp: torch.Tensor, ref: torch.Tensor, kind: str) -> torch.Tensor:
    d = logp - ref
    if kind in ("kl", "k1"):
        return d
    if kind == "abs":
        return d.abs()
    if kind in ("mse", "k2"):
        return 0.5 * d.pow(2)
    return (torch.exp(-d) + d - 1).clamp(-10.0, 10.0)  # low_var_kl / k3


def grpo(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    context: dict[str, torch.Tensor],
    config: dict,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The ``grpo`` loss and its metrics (see the module doc for every term)."""
    mask = (context["loss_mask"] > 0).to(logprobs.dtype)
    advantages = context["advantages"].to(logprobs.dtype)
    old = context.get("old_log_probs_shifted")
    old = logprobs.detach() if old is None else old.to(logprobs.dtype)
    metrics: dict[str, float] = {}
    n_tokens = float(mask.sum())
    denom = n_tokens or 1.0

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

    versions = context.get("versions")
    current = config.get("current_version")
    if versions is not None and current is not None and n_tokens:
        stale = (float(current) - versions.to(logprobs.dtype)) * mask
        metrics.update(
            staleness_mean=float(stale.sum()) / denom,
            staleness_max=float(stale[mask > 0].max()),
        )

    decoupled = bool(config["use_decoupled_loss"])
    prox = None
    if decoupled:
        method = config["prox_logp_method"]
        given = context.get("prox_logp_shifted")
        if method == "loglinear" and given is None:
            prox = _loglinear_prox(logprobs, old, versions, int(current))
        else:
            prox = old if given is None else given.to(logprobs.dtype)
        if method == "metrics":
            approx = _loglinear_prox(logprobs, old, versions, int(current))
            err = (approx - prox).abs() * mask
            metrics.update(
                prox_loglinear_abs_error=float(err.sum()) / denom,
                prox_loglinear_imp_weight_error=float(
                    ((torch.exp(approx - old) - torch.exp(prox - old)).abs() * mask).sum()
                )
                / denom,
            )
    anchor = prox if decoupled else old

    threshold = config.get("m2_threshold")
    if threshold is not None:
        base = prox if decoupled else logprobs.detach()
        kept = _m2_keep((base - old) * mask, mask, float(threshold))
        metrics["m2_masked_fraction"] = float((mask - kept).sum()) / denom
        mask = kept

    if config["importance_sampling_level"] == "sequence":
        counts = mask.sum(-1, keepdim=True)
        seq = ((logprobs - anchor) * mask).sum(-1, keepdim=True) / counts.clamp(min=1)
        log_ratio = seq.expand_as(logprobs) * mask
    else:
        log_ratio = (logprobs - anchor) * mask
    ratio = torch.exp(log_ratio)

    eps_low = float(config["eps_clip"])
    eps_high = float(
        config["eps_clip_higher"] if config["eps_clip_higher"] is not None else eps_low
    )
    clip_active = torch.zeros_like(mask, dtype=torch.bool)
    if config["use_cispo_loss"]:
        cap = config["is_weight_clip_max"]
        cap = float(cap) if cap is not None else 1.0 + eps_high
        weight = ratio.detach().clamp(max=cap)
        per_token = -advantages * weight * logprobs
        clip_active = (ratio.detach() > cap) & (mask > 0)
        metrics["cispo_weight_mean"] = float((weight * mask).sum()) / denom
    elif config["use_sapo_loss"]:
        gate_tau = torch.where(
            advantages > 0,
            torch.full_like(advantages, float(config["sapo_tau_pos"])),
            torch.full_like(advantages, float(config["sapo_tau_neg"])),
        )
        gate = torch.sigmoid(gate_tau * (ratio - 1.0)) * 4.0 / gate_tau
        per_token = -advantages * gate
        metrics["sapo_gate_mean"] = float((gate.detach() * mask).sum()) / denom
    else:
        unclipped = -advantages * ratio
        clipped_obj = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
        per_token = torch.maximum(unclipped, clipped_obj)
        clip_active = (clipped_obj > unclipped) & (mask > 0)
        if config["c_clip"] is not None:
            dual = -advantages * float(config["c_clip"])
            dual_active = (advantages < 0) & (per_token > dual) & (mask > 0)
            per_token = torch.where(advantages < 0, torch.minimum(per_token, dual), per_token)
            metrics["dual_clip_ratio"] = float(dual_active.sum()) / denom

    if decoupled:
        behav = torch.exp(prox - old).detach()
        if config["behav_imp_weight_cap"] is not None:
            over = (behav > float(config["behav_imp_weight_cap"])) & (mask > 0)
            behav = behav.masked_fill(over, 0.0)
            metrics["behave_masked_fraction"] = float(over.sum()) / denom
        per_token = per_token * behav
        metrics["behave_imp_weight"] = float((behav * mask).sum()) / denom

    groups = context.get("prompt_group_ids")
    groups = groups[:, 0] if groups is not None else None
    loss = aggregate(per_token, mask, config, groups)
    coeff = float(config["entropy_coeff"])
    if coeff and entropy is not None:
        loss = loss - coeff * aggregate(entropy, mask, config, groups)
    if config["use_kl_loss"]:
        kl = _kl_term(logprobs, context["ref_log_probs_shifted"].to(logprobs.dtype),
                      config["kl_loss_type"])  # fmt: skip
        kl_loss = aggregate(kl, mask, config, groups)
        loss = loss + float(config["kl_loss_coef"]) * kl_loss
        metrics["kl_loss"] = float(kl_loss.detach())

    with torch.no_grad():
        lr = log_ratio.detach()
        approx_kl = (torch.exp(-lr) - 1 + lr) * mask  # k3 estimator of KL(pi_anchor || pi)
        metrics.update(
            grpo_stats_token_count=n_tokens,
            clip_ratio=float(clip_active.sum()) / denom,
            approx_kl=float(approx_kl.sum()) / denom,
            importance_weight=float((ratio.detach() * mask).sum()) / denom,
            advantage_mean=float((advantages * mask).sum()) / denom,
            grpo_importance_weight_sum=float((ratio.detach() * mask).sum()),
            grpo_log_ratio_sum=float((lr * mask).sum()),
            grpo_clipped_token_count=float(clip_active.sum()),
        )
        if entropy is not None:
            metrics["entropy"] = float((entropy * mask).sum()) / denom
            metrics["grpo_entropy_sum"] = float((entropy * mask).sum())
    return loss, metrics
