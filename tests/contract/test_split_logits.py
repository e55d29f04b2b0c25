"""forward_backward projects only the positions that carry loss through the output layer with a
graph (worker ``_token_logprobs``): the per-token logprobs, entropy and every gradient equal the
whole-sequence computation, with LoRA and without, with a per-token temperature; a batch whose
first position carries loss, or a model type not known to be ``lm_head(body(x))``, takes the
whole-sequence path."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from cortex_recipes.local import processors
from cortex_recipes.local.loss_schemas import Processing
from cortex_recipes.local.model_worker import TrainingWorker
from cortex_recipes.models import load_causal_lm
from cortex_recipes.models.fixtures import TINY_QWEN3

GRPO = Processing.from_json({"loss_fn": "grpo", "post": ["compute_logprobs"], "config": {}})


def worker_with(model) -> TrainingWorker:
    worker = TrainingWorker.__new__(TrainingWorker)  # only the model is needed by the logprob path
    worker.model = model
    return worker


def batch(first: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 5000, (3, 14), generator=g)
    mask = torch.zeros(ids.shape)
    mask[:, first:-1] = 1.0
    mask[1, first] = 0.0  # rows need not all start where the batch does
    temperature = torch.linspace(0.6, 1.4, 42).reshape(3, 14)
    frame = {"kwargs": {"input_ids": ids}, "context": {"loss_mask": mask}}
    frame["context"]["temperature"] = temperature
    return ids, mask, frame


def run(worker, ids, mask, frame, split: bool):
    if not split:
        worker._split_logits = lambda kwargs, first: None
    targets = processors.shifted_labels(ids, None)
    logprobs, entropy = worker._token_logprobs(
        frame["kwargs"], frame["context"], targets, GRPO, frame
    )
    loss = -(logprobs * mask).sum() / mask.sum() - 0.01 * (entropy * mask).sum()
    loss.backward()
    grads = {
        name: p.grad.clone() for name, p in worker.model.named_parameters() if p.grad is not None
    }
    worker.model.zero_grad(set_to_none=True)
    return logprobs.detach(), entropy.detach(), grads


@pytest.mark.parametrize("lora", [False, True])
def test_the_split_path_equals_the_whole_sequence(lora):
    torch.manual_seed(0)
    model = load_causal_lm(TINY_QWEN3).train()
    if lora:
        model = get_peft_model(
            model, LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"])
        )
    ids, mask, frame = batch(first=6)
    calls = []
    worker = worker_with(model)
    real = worker._split_logits
    worker._split_logits = lambda kwargs, first: calls.append(first) or real(kwargs, first)
    split = run(worker, ids, mask, frame, split=True)
    assert calls == [6]
    whole = run(worker_with(model), ids, mask, frame, split=False)
    torch.testing.assert_close(split[0], whole[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(split[1], whole[1], atol=1e-5, rtol=1e-5)
    assert split[2].keys() == whole[2].keys() and split[2]
    for name in whole[2]:
        torch.testing.assert_close(split[2][name], whole[2][name], atol=1e-5, rtol=1e-4)


def test_nothing_is_split_when_the_first_position_carries_loss_or_the_model_is_unknown():
    model = load_causal_lm(TINY_QWEN3)
    worker = worker_with(model)
    assert worker._split_logits({"input_ids": torch.ones(1, 4, dtype=torch.long)}, 0) is None
    model.config.model_type = "gemma2"  # soft-capped logits: lm_head(body(x)) is not the logits
    assert worker._split_logits({"input_ids": torch.ones(1, 4, dtype=torch.long)}, 2) is None
