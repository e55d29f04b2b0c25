"""The trainer's per-token log-probabilities and entropy (``processors.token_logprobs_and_entropy``)
equal the textbook log-softmax formulas, values and gradients, with and without a temperature;
the entropy joins the graph only when a loss term needs it."""

from __future__ import annotations

import pytest
import torch

from cortex_recipes.local.processors import token_logprobs_and_entropy


def reference(logits, targets, temperature=None):
    scaled = logits if temperature is None else logits / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    out = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    out = out.masked_fill(targets == -100, 0.0)
    return out, -(logp.exp() * logp).sum(-1)


def case(seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 7, 50, generator=g) * 4).requires_grad_(True)
    targets = torch.randint(0, 50, (3, 7), generator=g)
    targets[0, -1] = targets[2, 3] = -100
    return logits, targets


@pytest.mark.parametrize("temperature", [None, 0.7])
def test_values_and_gradients_equal_the_log_softmax_formulas(temperature):
    logits, targets = case(0)
    weights = torch.linspace(0.1, 1.0, 21).reshape(3, 7)
    out, entropy = token_logprobs_and_entropy(
        logits, targets, with_entropy=True, temperature=temperature
    )
    (out * weights).sum().add(entropy.sum() * 0.3).backward()
    got = logits.grad.clone()
    logits.grad = None
    ref_out, ref_entropy = reference(logits, targets, temperature)
    (ref_out * weights).sum().add(ref_entropy.sum() * 0.3).backward()
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, logits.grad, atol=1e-5, rtol=1e-5)
    assert (out[0, -1], out[2, 3]) == (0.0, 0.0)


def test_entropy_stays_out_of_the_graph_unless_a_loss_term_needs_it():
    logits, targets = case(1)
    out, entropy = token_logprobs_and_entropy(
        logits, targets, with_entropy=True, entropy_grad=False
    )
    assert out.requires_grad and not entropy.requires_grad
    torch.testing.assert_close(entropy, reference(logits, targets)[1], atol=1e-5, rtol=1e-5)
    _, with_grad = token_logprobs_and_entropy(logits, targets, with_entropy=True)
    assert with_grad.requires_grad
    assert token_logprobs_and_entropy(logits, targets, with_entropy=False)[1] is None
