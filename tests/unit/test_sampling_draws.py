"""The sampler's draw: each row follows its own filtered, temperature-scaled distribution and
its own seed, whatever rows share its step."""

from __future__ import annotations

import pytest
import torch

from cortex_recipes.local.decoding import SamplingParams, _advance, _Row

pytestmark = pytest.mark.unit


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return ""


def rows(params: SamplingParams, seeds) -> list[_Row]:
    return [_Row(_Tok(), [1], params, set(), torch.Generator().manual_seed(s)) for s in seeds]


def test_draws_follow_the_scaled_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0])
    params = SamplingParams(max_tokens=10**6, temperature=0.7, ignore_eos=True)
    batch = rows(params, range(4))
    counts = torch.zeros(5)
    n = 5000
    for _ in range(n // 4):
        for t in _advance(batch, logits.expand(4, 5).clone()):
            counts[t] += 1
    expected = torch.softmax(logits / 0.7, dim=-1)
    assert torch.allclose(counts / n, expected, atol=0.02), (counts / n, expected)
    assert counts[4] == 0


def test_top_k_and_top_p_never_draw_a_filtered_token():
    logits = torch.tensor([3.0, 2.9, 0.5, 0.4, 0.3])
    for params in (
        SamplingParams(max_tokens=10**6, temperature=1.0, top_k=2, ignore_eos=True),
        SamplingParams(max_tokens=10**6, temperature=1.0, top_p=0.5, ignore_eos=True),
    ):
        batch = rows(params, range(3))
        seen = set()
        for _ in range(300):
            seen.update(_advance(batch, logits.expand(3, 5).clone()))
        assert seen <= {0, 1} and len(seen) == 2, (params, seen)


def test_a_row_draws_the_same_tokens_alone_or_beside_others():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g)
    hot = SamplingParams(max_tokens=10**6, temperature=1.3, ignore_eos=True)
    filtered = SamplingParams(max_tokens=10**6, temperature=0.8, top_k=5, ignore_eos=True)
    greedy = SamplingParams(max_tokens=10**6, temperature=0.0, ignore_eos=True)
    together = [*rows(hot, [7]), *rows(filtered, [8]), *rows(greedy, [9])]
    alone = [rows(hot, [7])[0], rows(filtered, [8])[0], rows(greedy, [9])[0]]
    for _ in range(20):
        mixed = _advance(together, logits.clone())
        single = [_advance([row], logits[i : i + 1].clone())[0] for i, row in enumerate(alone)]
        assert mixed == single
