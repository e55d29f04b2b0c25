"""The ``grpo`` processor's config, typed, with each default in one place.

The hosted service's ``grpo`` loss takes a
``processing.config``: the PPO ratio clip, how token losses are aggregated, an entropy bonus,
and for on-policy distillation the teacher term. :class:`GRPOLoss` names every key the local
backend implements with the default the service applies to a key a frame leaves out. Both
sides read it:

- the journeys' profiles default to these values and build their ``loss_config()`` from them
  (Math GRPO and async GRPO send only what the profile sets, OPD and TITO their PPO clip and
  teacher terms), and :mod:`cortex_recipes.frames` always names :data:`ALWAYS_SENT`;
- the local backend fills what a frame leaves out from :data:`DEFAULTS` and refuses any other
  key (:mod:`cortex_recipes.local.loss_schemas`);
- the teacher term's clip, ``[-teacher_clip_negative, teacher_clip]`` with
  ``teacher_clip_negative`` defaulting to ``teacher_clip``, is :func:`teacher_clip_bounds`,
  used by the backend's processor and by OPD's advantage baseline alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "prompt-mean",
)
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
PROX_LOGP_METHODS = ("recompute", "loglinear", "metrics")
# KL estimators of the reference-KL term (``use_kl_loss``), per token, d = logp - ref_logp.
KL_LOSS_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


@dataclass(frozen=True)
class GRPOLoss:
    """Every ``grpo`` config key the local backend implements, at the service's default."""

    eps_clip: float = 0.2  # PPO ratio clip, lower side
    eps_clip_higher: float | None = None  # upper side (None: eps_clip)
    loss_agg_mode: str = "token-mean"  # one of LOSS_AGG_MODES
    entropy_coeff: float = 0.0  # entropy bonus weight
    teacher_tau: float = 0.0  # weight of the teacher term (0: no teacher)
    teacher_clip: float | None = None  # cap on a positive teacher - student log ratio
    teacher_clip_negative: float | None = None  # cap on a negative one (None: teacher_clip)
    dp_size: int | None = None  # with batch_num_tokens: a global loss scale
    batch_num_tokens: int | None = None
    global_batch_size: int | None = None
    importance_sampling_level: str = "token"  # or "sequence": one ratio per row (GSPO)
    c_clip: float | None = None  # dual clip (> 1): caps a negative-advantage token's loss
    behav_imp_weight_cap: float | None = None  # decoupled loss: drop tokens above this weight
    m2_threshold: float | None = None  # M2PO: mask the largest log ratios until M2 <= this
    use_decoupled_loss: bool = False  # clip around the proximal policy, weight by prox / old
    prox_logp_method: str = "recompute"  # one of PROX_LOGP_METHODS
    current_version: int | None = None  # the trainer's policy version (loglinear, staleness)
    use_cispo_loss: bool = False  # CISPO: REINFORCE with a clipped, detached IS weight
    is_weight_clip_max: float | None = None  # CISPO weight cap (None: 1 + eps_clip_higher)
    use_sapo_loss: bool = False  # SAPO: a soft sigmoid gate instead of the hard clip
    sapo_tau_pos: float = 1.0  # gate temperature for positive advantages
    sapo_tau_neg: float = 1.05  # and for negative ones
    use_kl_loss: bool = False  # add kl_loss_coef * KL(policy || reference) per token
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"  # one of KL_LOSS_TYPES


DEFAULTS: dict[str, Any] = asdict(GRPOLoss())
# What a journey's frame names even at its default, so a record of the frame says the clip and
# aggregation it trained with.
ALWAYS_SENT = ("eps_clip", "loss_agg_mode")


def with_defaults_named(loss_config: dict[str, Any]) -> dict[str, Any]:
    """``loss_config`` with :data:`ALWAYS_SENT` filled from :data:`DEFAULTS` where unset."""
    return {**{key: DEFAULTS[key] for key in ALWAYS_SENT}, **loss_config}


def teacher_config(tau: float, clip: float | None, clip_negative: float | None) -> dict[str, Any]:
    """The teacher keys of a ``grpo`` config: ``teacher_tau`` always, the clips when it is on."""
    config: dict[str, Any] = {"teacher_tau": tau}
    if tau > 0:
        config["teacher_clip"] = clip
        if clip_negative is not None:
            config["teacher_clip_negative"] = clip_negative
    return config


def teacher_clip_bounds(config: dict[str, Any]) -> tuple[float, float]:
    """``(negative, positive)`` caps of the teacher term's log ratio in a config with
    ``teacher_clip`` set (``teacher_clip_negative`` unset or 0: the positive cap)."""
    positive = float(config["teacher_clip"])
    return float(config.get("teacher_clip_negative") or positive), positive
