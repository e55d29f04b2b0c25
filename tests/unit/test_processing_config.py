"""Strict validation of processing blocks and job configs: each bad field is named."""

import pytest
import torch

from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.frame_checks import validate_context
from cortex_recipes.local.grpo import grpo
from cortex_recipes.local.loss_schemas import parse_processing
from cortex_recipes.local.processors import causal_cross_entropy
from cortex_recipes.local.specs import parse_optimizer, parse_sub_jobs

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"loss_fn": "ppo"}, "loss_fn='ppo' is not registered"),
        (
            {"loss_fn": "causal_cross_entropy", "post": ["entropy"]},
            "'entropy', which is not registered",
        ),
        (
            {"loss_fn": "causal_cross_entropy", "config": {"temperature": 1}},
            "unknown keys ['temperature']",
        ),
        ({"loss_fn": "causal_cross_entropy", "config": {"dp_size": 2}}, "dp_size requires"),
        (
            {"loss_fn": "grpo", "config": {"kl_loss_type": "full", "use_kl_loss": True}},
            "kl_loss_type='full' is not supported by the local backend",
        ),
        (
            {"loss_fn": "grpo", "config": {"use_cispo_loss": True, "use_sapo_loss": True}},
            "use_cispo_loss and use_sapo_loss are both true",
        ),
        ({"loss_fn": "grpo", "config": {"c_clip": 1.0}}, "c_clip=1.0 must be > 1"),
        (
            {"loss_fn": "grpo", "config": {"behav_imp_weight_cap": 5.0}},
            "behav_imp_weight_cap=5.0 acts only with use_decoupled_loss=true",
        ),
        (
            {"loss_fn": "grpo", "config": {"is_weight_clip_max": 2.0}},
            "is_weight_clip_max=2.0 acts only with use_cispo_loss=true",
        ),
        (
            {
                "loss_fn": "grpo",
                "config": {"use_decoupled_loss": True, "prox_logp_method": "loglinear"},
            },
            "requires processing.config.current_version",
        ),
        (
            {"loss_fn": "grpo", "config": {"importance_sampling_level": "geo"}},
            "importance_sampling_level='geo'; accepted: token, sequence",
        ),
        ({"loss_fn": "grpo", "config": {"use_kl_loss": 1}}, "use_kl_loss=1 must be true or false"),
        (
            {"loss_fn": "grpo", "config": {"aux_ce_weight": 0.1}},
            "unknown keys ['aux_ce_weight']",
        ),
        ({"loss_fn": "grpo", "config": {"eps": 0.2}}, "unknown keys ['eps']"),
        (
            {"loss_fn": "grpo", "config": {"teacher_tau": 0.5}},
            "requires a finite positive teacher_clip",
        ),
        ({"loss_fn": "grpo", "config": {"loss_agg_mode": "sum"}}, "loss_agg_mode='sum'"),
        ({"loss_fn": "grpo", "extra": 1}, "unknown keys ['extra']"),
    ],
)
def test_bad_processing_blocks_name_the_field(block, message):
    with pytest.raises(BackendError) as info:
        parse_processing(block, require_loss=True)
    assert message in str(info.value)


def test_grpo_defaults_are_filled_in():
    processing = parse_processing(
        {"loss_fn": "grpo", "config": {"eps_clip": 0.1}}, require_loss=True
    )
    assert (
        processing.config["eps_clip"] == 0.1 and processing.config["loss_agg_mode"] == "token-mean"
    )


def test_causal_ce_rejects_labels_masked_where_weighted():
    ids = torch.arange(6).reshape(1, 6)
    processing = parse_processing({"loss_fn": "causal_cross_entropy"}, require_loss=True)
    labels = torch.full((1, 6), -100)
    with pytest.raises(BackendError, match="labels is -100"):
        validate_context(processing, {"loss_mask": torch.ones(1, 6), "labels": labels}, ids)


def test_causal_ce_is_weighted_mean_and_empty_mask_gives_connected_zero():
    lp = torch.tensor([[-1.0, -2.0, -4.0]], requires_grad=True)
    loss, _ = causal_cross_entropy(lp, {"loss_mask": torch.tensor([[1.0, 0.5, 0.0]])}, {})
    assert float(loss) == pytest.approx((1.0 + 0.5 * 2.0) / 1.5)
    zero, _ = causal_cross_entropy(lp, {"loss_mask": torch.zeros(1, 3)}, {})
    zero.backward()
    assert float(zero) == 0.0 and lp.grad is not None


def test_grpo_teacher_term_is_clipped_asymmetrically():
    lp = torch.zeros(1, 4)
    teacher = torch.tensor([[2.0, -2.0, 0.1, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    config = parse_processing(
        {
            "loss_fn": "grpo",
            "config": {"teacher_tau": 1.0, "teacher_clip": 0.5, "teacher_clip_negative": 1.0},
        },
        require_loss=True,
    ).config
    context = {
        "loss_mask": mask,
        "advantages": torch.zeros(1, 4),
        "teacher_log_probs_shifted": teacher,
    }
    loss, metrics = grpo(lp, None, context, config)
    # advantages become [0.5, -1.0, 0.1] on scored tokens; ratio 1 -> loss = -mean(adv).
    assert float(loss) == pytest.approx(-(0.5 - 1.0 + 0.1) / 3)
    assert metrics["teacher_clipped_fraction"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"name": "SGD", "lr": 0.1}, "only AdamW"),
        ({"name": "AdamW"}, "lr is required"),
        ({"name": "AdamW", "lr": 1e-4, "warmup_steps": 10}, "scheduler keys"),
        ({"name": "AdamW", "lr": 1e-4, "momentum": 0.9}, "unknown keys ['momentum']"),
    ],
)
def test_bad_optimizer_blocks_are_rejected(block, message):
    with pytest.raises(BackendError) as info:
        parse_optimizer(block, "training_config.optimizer")
    assert message in str(info.value)


def test_deepspeed_optimizer_form_is_flattened():
    spec = parse_optimizer({"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.95]}}, "opt")
    assert spec.lr == 2e-5 and spec.betas == (0.9, 0.95)


def test_sub_job_ids_are_explicit_and_one_training_sub_job_at_most():
    base = {"model_name": "tiny-qwen3", "inference_config": {"max_seq_len": 64, "n_gpus": 1}}
    specs = parse_sub_jobs(
        "j1", [{**base, "job_type": "sampling"}, {**base, "job_type": "log_probability"}]
    )
    assert [s.sub_job_id for s in specs] == ["j1:sampling:0", "j1:log_prob:0"]
    training = {
        "job_type": "training",
        "model_name": "tiny-qwen3",
        "training_config": {
            "optimizer": {"lr": 1e-3},
            "max_seq_len": 64,
            "train_batch_size": 1,
            "n_gpus": 1,
        },
    }
    with pytest.raises(BackendError, match="at most one training"):
        parse_sub_jobs("j1", [training, training])
