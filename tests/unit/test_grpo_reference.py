"""Every ``grpo`` variant against an independent float64 reference written from the formulas.

The reference below walks rows and tokens one scalar at a time (plain Python control flow over
float64 scalars), from the formulas in docs/local-backend.md ("The grpo loss, term by term"),
not from the backend's vectorised code; loss and gradient with respect to the logprobs must
agree within 1e-6 for each variant and for configs that mix them.
"""

from __future__ import annotations

import math

import pytest
import torch

from cortex_recipes import grpo_loss
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.frame_checks import validate_context
from cortex_recipes.local.grpo import grpo
from cortex_recipes.local.loss_schemas import parse_processing

pytestmark = pytest.mark.unit

B, T, CURRENT = 4, 7, 5


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    old = logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    prox = logp + 0.15 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    mask[:, 0] = 0  # the prompt column
    mask[3] = 0  # a row with nothing scored
    mask[0, 1:4] = 1
    adv_row = torch.randn(B, 1, generator=g, dtype=torch.float64)
    adv = adv_row.expand(B, T) + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return {
        "logp": logp,
        "old_log_probs_shifted": old,
        "prox_logp_shifted": prox,
        "loss_mask": mask,
        "advantages": adv * mask,
        "versions": torch.randint(CURRENT - 3, CURRENT + 1, (B, T), generator=g),
        "ref_log_probs_shifted": logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "teacher_log_probs_shifted": logp + torch.randn(B, T, generator=g, dtype=torch.float64),
        "prompt_group_ids": torch.tensor([[0] * T, [0] * T, [1] * T, [1] * T]),
        "entropy": torch.rand(B, T, generator=g, dtype=torch.float64) * 2,
    }


# --------------------------------------------------------------------------------------------
# The reference: scalars, loops, formulas
# --------------------------------------------------------------------------------------------


def _reference(logp: torch.Tensor, data: dict, cfg: dict, context_keys: set) -> torch.Tensor:
    c = {**grpo_loss.DEFAULTS, **cfg}
    scored = [[data["loss_mask"][b, t].item() > 0 for t in range(T)] for b in range(B)]

    def old(b, t):
        if "old_log_probs_shifted" in context_keys:
            return data["old_log_probs_shifted"][b, t].item()
        return logp[b, t].item()

    def adv(b, t):
        a = data["advantages"][b, t].item()
        if c["teacher_tau"] > 0 and scored[b][t]:
            d = data["teacher_log_probs_shifted"][b, t].item() - logp[b, t].item()
            lo = c["teacher_clip_negative"] or c["teacher_clip"]
            a += c["teacher_tau"] * min(max(d, -lo), c["teacher_clip"])
        return a

    def prox(b, t):
        if "prox_logp_shifted" in context_keys:
            return data["prox_logp_shifted"][b, t].item()
        if c["prox_logp_method"] == "loglinear":
            v = data["versions"][b, t].item()
            cur = c["current_version"]
            alpha = 0.0 if v >= cur else (cur - 1 - v) / (cur - v)
            return old(b, t) + alpha * (logp[b, t].item() - old(b, t))
        return old(b, t)

    def anchor(b, t):
        return prox(b, t) if c["use_decoupled_loss"] else old(b, t)

    keep = [row[:] for row in scored]
    if c["m2_threshold"] is not None:
        base = prox if c["use_decoupled_loss"] else (lambda b, t: logp[b, t].item())
        cells = [(b, t) for b in range(B) for t in range(T) if scored[b][t]]
        sq = {(b, t): (base(b, t) - old(b, t)) ** 2 for b, t in cells}
        order = sorted(cells, key=lambda cell: -sq[cell])  # stable: ties keep position order
        remaining = list(cells)
        for cell in order:
            if sum(sq[x] for x in remaining) / len(remaining) <= c["m2_threshold"]:
                break
            remaining.remove(cell)
            keep[cell[0]][cell[1]] = False

    def ratio(b, t):
        if c["importance_sampling_level"] == "sequence":
            cols = [u for u in range(T) if keep[b][u]]
            total = sum(logp[b, u] - anchor(b, u) for u in cols)
            return torch.exp(total / max(len(cols), 1))
        return torch.exp(logp[b, t] - anchor(b, t))

    lo, hi = c["eps_clip"], c["eps_clip_higher"]
    hi = lo if hi is None else hi

    def surrogate(b, t):
        a, r = adv(b, t), ratio(b, t)
        if c["use_cispo_loss"]:
            cap = c["is_weight_clip_max"] if c["is_weight_clip_max"] is not None else 1 + hi
            return -a * min(r.item(), cap) * logp[b, t]
        if c["use_sapo_loss"]:
            tau = c["sapo_tau_pos"] if a > 0 else c["sapo_tau_neg"]
            return -a * (4 / tau) * torch.sigmoid(tau * (r - 1))
        clipped = torch.clamp(r, 1 - lo, 1 + hi)
        loss = torch.maximum(-a * r, -a * clipped)
        if c["c_clip"] is not None and a < 0:
            loss = torch.minimum(loss, torch.tensor(-a * c["c_clip"], dtype=torch.float64))
        return loss

    def per_token(b, t):
        loss = surrogate(b, t)
        if c["use_decoupled_loss"]:
            w = math.exp(prox(b, t) - old(b, t))
            cap = c["behav_imp_weight_cap"]
            loss = loss * (0.0 if cap is not None and w > cap else w)
        return loss

    def kl(b, t):
        d = logp[b, t] - data["ref_log_probs_shifted"][b, t].item()
        kind = c["kl_loss_type"]
        if kind in ("kl", "k1"):
            return d
        if kind == "abs":
            return torch.abs(d)
        if kind in ("mse", "k2"):
            return 0.5 * d * d
        return torch.clamp(torch.exp(-d) + d - 1, -10, 10)

    def agg(term) -> torch.Tensor:
        zero = logp.sum() * 0
        cells = [(b, t) for b in range(B) for t in range(T) if keep[b][t]]
        mode = c["loss_agg_mode"]
        if mode == "token-mean":
            total = sum((term(b, t) for b, t in cells), zero)
            if c["batch_num_tokens"] is not None:
                return total * (c["dp_size"] or 1) / c["batch_num_tokens"]
            return total / len(cells)
        rows = [b for b in range(B) if any(keep[b])]
        sums = {b: sum((term(b, t) for t in range(T) if keep[b][t]), zero) for b in rows}
        counts = {b: sum(keep[b]) for b in rows}
        if mode == "seq-mean-token-mean":
            return sum((sums[b] / counts[b] for b in rows), zero) / len(rows)
        if mode == "seq-mean-token-sum":
            return sum((sums[b] for b in rows), zero) / len(rows)
        if mode == "seq-mean-token-sum-norm":
            return sum((sums[b] for b in rows), zero) / (len(rows) * T)
        groups = {}
        for b in rows:
            groups.setdefault(data["prompt_group_ids"][b, 0].item(), []).append(b)
        means = [
            sum((sums[b] for b in members), zero) / sum(counts[b] for b in members)
            for members in groups.values()
        ]
        return sum(means, zero) / len(means)

    loss = agg(per_token)
    if c["entropy_coeff"]:
        loss = loss - c["entropy_coeff"] * agg(lambda b, t: data["entropy"][b, t])
    if c["use_kl_loss"]:
        loss = loss + c["kl_loss_coef"] * agg(kl)
    return loss


# --------------------------------------------------------------------------------------------

OLD = {"old_log_probs_shifted"}
CASES = [
    ("ppo", {}, OLD),
    ("ppo on-policy (no old logprobs)", {}, set()),
    ("asymmetric clip", {"eps_clip": 0.1, "eps_clip_higher": 0.28}, OLD),
    ("dual clip", {"c_clip": 1.5, "eps_clip": 0.05}, OLD),
    ("sequence level", {"importance_sampling_level": "sequence"}, OLD),
    ("decoupled, recompute, given prox", {"use_decoupled_loss": True}, OLD | {"prox_logp_shifted"}),
    ("decoupled, recompute, no prox", {"use_decoupled_loss": True}, OLD),
    (
        "decoupled, behaviour cap",
        {"use_decoupled_loss": True, "behav_imp_weight_cap": 1.2},
        OLD | {"prox_logp_shifted"},
    ),
    (
        "decoupled, loglinear",
        {"use_decoupled_loss": True, "prox_logp_method": "loglinear", "current_version": CURRENT},
        OLD | {"versions"},
    ),
    (
        "decoupled, metrics",
        {"use_decoupled_loss": True, "prox_logp_method": "metrics", "current_version": CURRENT},
        OLD | {"versions", "prox_logp_shifted"},
    ),
    ("m2po", {"m2_threshold": 0.05}, OLD),
    ("cispo", {"use_cispo_loss": True, "eps_clip_higher": 0.28}, OLD),
    ("cispo, weight cap", {"use_cispo_loss": True, "is_weight_clip_max": 1.1}, OLD),
    ("sapo", {"use_sapo_loss": True}, OLD),
    ("sapo, taus", {"use_sapo_loss": True, "sapo_tau_pos": 0.5, "sapo_tau_neg": 2.0}, OLD),
    *[
        (
            f"kl {kind}",
            {"use_kl_loss": True, "kl_loss_type": kind, "kl_loss_coef": 0.3},
            OLD | {"ref_log_probs_shifted"},
        )
        for kind in grpo_loss.KL_LOSS_TYPES
    ],  # fmt: skip
    *[
        (f"aggregation {mode}", {"loss_agg_mode": mode}, OLD | {"prompt_group_ids"})
        for mode in grpo_loss.LOSS_AGG_MODES
    ],
    ("global scale", {"dp_size": 2, "batch_num_tokens": 40}, OLD),
    ("entropy bonus", {"entropy_coeff": 0.01}, OLD),
    (
        "teacher term",
        {"teacher_tau": 0.5, "teacher_clip": 0.4, "teacher_clip_negative": 0.2},
        OLD | {"teacher_log_probs_shifted"},
    ),
    (
        "mixed: decoupled loglinear + cap + m2 + sequence + dual clip + kl + seq-mean",
        {
            "use_decoupled_loss": True,
            "prox_logp_method": "loglinear",
            "current_version": CURRENT,
            "behav_imp_weight_cap": 1.5,
            "m2_threshold": 0.02,
            "importance_sampling_level": "sequence",
            "eps_clip_higher": 0.28,
            "c_clip": 2.0,
            "use_kl_loss": True,
            "kl_loss_type": "low_var_kl",
            "loss_agg_mode": "seq-mean-token-mean",
            "entropy_coeff": 0.02,
        },
        OLD | {"versions", "ref_log_probs_shifted"},
    ),  # fmt: skip
    (
        "mixed: cispo + decoupled recompute + m2 + prompt-mean + kl k2",
        {
            "use_cispo_loss": True,
            "use_decoupled_loss": True,
            "m2_threshold": 0.03,
            "loss_agg_mode": "prompt-mean",
            "use_kl_loss": True,
            "kl_loss_type": "k2",
        },
        OLD | {"prox_logp_shifted", "prompt_group_ids", "ref_log_probs_shifted"},
    ),  # fmt: skip
    (
        "mixed: sapo + teacher + sequence-free token level + global scale",
        {
            "use_sapo_loss": True,
            "teacher_tau": 0.3,
            "teacher_clip": 1.0,
            "dp_size": 4,
            "batch_num_tokens": 33,
        },
        OLD | {"teacher_log_probs_shifted"},
    ),  # fmt: skip
]


def _context(data: dict, keys: set) -> dict[str, torch.Tensor]:
    context = {"loss_mask": data["loss_mask"], "advantages": data["advantages"]}
    context.update({key: data[key] for key in keys})
    return context


@pytest.mark.parametrize(("name", "cfg", "keys"), CASES, ids=[case[0] for case in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_variant_matches_the_float64_reference(name, cfg, keys, seed):
    data = _inputs(seed)
    config = parse_processing({"loss_fn": "grpo", "config": cfg}, require_loss=True).config
    context = _context(data, keys)
    validate_context(
        parse_processing({"loss_fn": "grpo", "config": cfg}, require_loss=True),
        context, data["logp"].long() * 0,
    )  # fmt: skip
    entropy = data["entropy"] if cfg.get("entropy_coeff") else None

    logp = data["logp"].clone().requires_grad_(True)
    loss, metrics = grpo(logp, entropy, context, config)
    (grad,) = torch.autograd.grad(loss, logp)

    ref_logp = data["logp"].clone().requires_grad_(True)
    expected = _reference(ref_logp, data, cfg, keys)
    (ref_grad,) = torch.autograd.grad(expected, ref_logp)

    assert loss.dtype == torch.float64
    assert abs(float(loss) - float(expected)) <= 1e-6 * max(1.0, abs(float(expected))), name
    assert torch.allclose(grad, ref_grad, rtol=1e-6, atol=1e-9), (name, grad - ref_grad)
    assert math.isfinite(metrics["approx_kl"])


def test_the_variants_differ_from_each_other():
    """A variant that silently fell back to the plain PPO loss would pass its reference only if
    the reference fell back too: each variant's loss must differ from plain PPO's here."""
    data = _inputs(0)
    plain = _reference(data["logp"], data, {}, OLD)
    for name, cfg, keys in CASES[2:]:
        if name.startswith(("aggregation token-mean", "decoupled, recompute, no prox")):
            continue  # token-mean is the default; decoupled without prox is plain PPO by design
        value = _reference(data["logp"], data, cfg, keys)
        assert abs(float(value) - float(plain)) > 1e-9, name


def test_m2_masks_the_fewest_largest_tokens():
    data = _inputs(0)
    config = parse_processing(
        {"loss_fn": "grpo", "config": {"m2_threshold": 0.05}}, require_loss=True
    ).config
    _, metrics = grpo(data["logp"], None, _context(data, OLD), config)
    scored = int(data["loss_mask"].sum())
    d2 = sorted(
        ((data["logp"] - data["old_log_probs_shifted"])[data["loss_mask"] > 0] ** 2).tolist(),
        reverse=True,
    )
    k = next(k for k in range(scored) if sum(d2[k:]) / (scored - k) <= 0.05)
    assert k > 0
    assert metrics["m2_masked_fraction"] == pytest.approx(k / scored)


def test_version_and_staleness_metrics():
    data = _inputs(0)
    cfg = {"use_decoupled_loss": True, "prox_logp_method": "metrics", "current_version": CURRENT}
    config = parse_processing({"loss_fn": "grpo", "config": cfg}, require_loss=True).config
    _, metrics = grpo(data["logp"], None, _context(data, OLD | {"versions", "prox_logp_shifted"}),
                      config)  # fmt: skip
    scored = data["loss_mask"] > 0
    stale = (CURRENT - data["versions"])[scored].double()
    assert metrics["staleness_mean"] == pytest.approx(float(stale.mean()))
    assert metrics["staleness_max"] == float(stale.max())
    assert metrics["prox_loglinear_abs_error"] > 0


@pytest.mark.parametrize(
    ("cfg", "keys", "message"),
    [
        ({"use_kl_loss": True}, OLD, "use_kl_loss=true requires context.ref_log_probs_shifted"),
        (
            {"use_decoupled_loss": True, "prox_logp_method": "loglinear", "current_version": 3},
            OLD,
            "requires context.versions",
        ),
        (
            {"use_decoupled_loss": True, "prox_logp_method": "metrics", "current_version": 3},
            OLD | {"versions"},
            "requires context.prox_logp_shifted",
        ),
        ({"loss_agg_mode": "prompt-mean"}, OLD, "requires context.prompt_group_ids"),
    ],
)
def test_missing_context_is_named(cfg, keys, message):
    data = _inputs(0)
    processing = parse_processing({"loss_fn": "grpo", "config": cfg}, require_loss=True)
    with pytest.raises(BackendError) as info:
        validate_context(processing, _context(data, keys), data["logp"].long() * 0)
    assert message in str(info.value)


def test_non_finite_prox_where_scored_is_refused():
    data = _inputs(0)
    data["prox_logp_shifted"][0, 2] = float("-inf")
    processing = parse_processing(
        {"loss_fn": "grpo", "config": {"use_decoupled_loss": True}}, require_loss=True
    )
    with pytest.raises(BackendError, match="prox_logp_shifted is non-finite at row 0, position 2"):
        validate_context(processing, _context(data, OLD | {"prox_logp_shifted"}),
                         data["logp"].long() * 0)  # fmt: skip


def test_prompt_groups_must_be_constant_per_row():
    data = _inputs(0)
    data["prompt_group_ids"][2, 3] = 5
    processing = parse_processing(
        {"loss_fn": "grpo", "config": {"loss_agg_mode": "prompt-mean"}}, require_loss=True
    )
    with pytest.raises(BackendError, match="prompt_group_ids differs within row 2"):
        validate_context(processing, _context(data, OLD | {"prompt_group_ids"}),
                         data["logp"].long() * 0)  # fmt: skip
