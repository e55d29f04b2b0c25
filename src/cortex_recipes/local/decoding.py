"""Token-by-token generation with a KV cache: seeded, exact token ids, raw per-token logprobs.

Logprobs are taken from the model's unscaled distribution (before temperature and top-p), which
is what a trainer computes for the same ids; this matches vLLM's ``raw_logprobs`` mode.

Everything runs on the model's device, per-row generators included (a generator must live on
the device whose tensors it samples). Parameters arrive validated
(:func:`cortex_recipes.local.generate_params.parse_sampling_params`). The continuous-batching loop
that drives these rows is :mod:`cortex_recipes.local.batcher`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SamplingParams:
        return cls(
            **{
                **data,
                "stop": tuple(data.get("stop") or ()),
                "stop_token_ids": tuple(data.get("stop_token_ids") or ()),
            }
        )


def _filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    logits = logits / params.temperature
    if params.top_k and params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    return logits


class _Row:
    """One completion being sampled: its tokens, logprobs and stop state."""

    def __init__(
        self, tokenizer, prompt_ids: list[int], params: SamplingParams, eos_ids, generator
    ):
        self.tokenizer = tokenizer
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.generator = generator
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_ids))
        self.out_ids: list[int] = []
        self.out_logprobs: list[dict[str, dict[str, float]]] = []
        self.finish_reason: str = "length"
        self.stop_reason: int | str | None = None
        self.text_cut: int | None = None
        self.done = False
        # (weight version, index of the first output token sampled under it), in order.
        self.versions: list[tuple[int, int]] = []

    def note_version(self, version: int) -> None:
        """Record that the next token is sampled under weight ``version``."""
        if not self.versions or self.versions[-1][0] != version:
            self.versions.append((version, len(self.out_ids)))

    def record(self, token: int, logprob: float | None, top: list[tuple[float, int]]) -> None:
        """Append the chosen token (and its logprobs); update the stop state."""
        params = self.params
        self.out_ids.append(token)
        if params.logprobs is not None:
            entry = {str(token): {"logprob": logprob}}
            for rank, (lp, tid) in enumerate(top):
                entry.setdefault(str(tid), {"logprob": lp})["rank"] = rank + 1
            self.out_logprobs.append(entry)
        if token in self.stop_ids:
            self.finish_reason, self.stop_reason, self.done = "stop", token, True
        elif params.stop:
            text = self.tokenizer.decode(
                self.out_ids, skip_special_tokens=params.skip_special_tokens
            )
            hits = [(text.find(s), s) for s in params.stop if s in text]
            if hits:
                pos, s = min(hits)
                self.text_cut = pos + (len(s) if params.include_stop_str_in_output else 0)
                self.finish_reason, self.stop_reason, self.done = "stop", s, True
        if len(self.out_ids) >= params.max_tokens:
            self.done = True

    def result(self) -> dict[str, Any]:
        text = self.tokenizer.decode(
            self.out_ids, skip_special_tokens=self.params.skip_special_tokens
        )
        if self.text_cut is not None:
            text = text[: self.text_cut]
        result: dict[str, Any] = {
            "text": text,
            "token_ids": self.out_ids,
            "prompt_token_ids": self.prompt_ids,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
        }
        if self.params.logprobs is not None:
            result["logprobs"] = self.out_logprobs
        # Which weights sampled which tokens: a weight sync can land between two decode steps.
        result["weight_versions"] = [v for v, _ in self.versions]
        result["weight_version_starts"] = [start for _, start in self.versions]
        return result


def _sample(rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
    """One token per row from its filtered, temperature-scaled distribution.

    Inverse-CDF sampling: one uniform draw ``u`` from the row's own generator picks the first
    token whose cumulative probability (float64) exceeds ``u`` times the total, so a row's
    sample depends on its seed and its logits only, never on its neighbours, and costs one draw
    instead of ``torch.multinomial``'s one exponential per vocabulary entry.
    """
    plain = all(row.params.top_k <= 0 and row.params.top_p >= 1.0 for row in rows)
    if plain:
        temperature = torch.tensor(
            [row.params.temperature for row in rows], dtype=logits.dtype, device=logits.device
        )
        scaled = logits / temperature.unsqueeze(-1)
    else:
        scaled = torch.stack([_filter_logits(logits[i], row.params) for i, row in enumerate(rows)])
    cdf = torch.softmax(scaled, dim=-1, dtype=torch.float64).cumsum(dim=-1)
    u = torch.cat(
        [
            torch.rand(1, generator=row.generator, device=logits.device, dtype=torch.float64)
            for row in rows
        ]
    )
    picked = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return picked.clamp(max=logits.shape[-1] - 1)


def _advance(rows: list[_Row], logits: torch.Tensor) -> list[int]:
    """Choose each row's next token from ``logits`` ([rows, vocab], fp32) and record it.

    Device work is batched so that one step costs a few host syncs, not a few per row: greedy
    rows share one argmax, sampled rows share one softmax and one inverse-CDF lookup, each with
    one uniform draw from its own generator, and the chosen ids and their logprobs come back to
    the host in one transfer each.
    """
    tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
    greedy = [i for i, row in enumerate(rows) if row.params.temperature == 0.0]
    if greedy:
        tokens[greedy] = torch.argmax(logits[greedy], dim=-1)
    sampled = [i for i, row in enumerate(rows) if row.params.temperature != 0.0]
    if sampled:
        tokens[sampled] = _sample(
            [rows[i] for i in sampled], logits[sampled] if len(sampled) < len(rows) else logits
        )
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    chosen: dict[int, float] = {}
    tops: dict[int, list[tuple[float, int]]] = {}
    if wanted:
        raw = torch.log_softmax(logits[wanted], dim=-1)
        picked = raw.gather(-1, tokens[wanted].unsqueeze(-1)).squeeze(-1).tolist()
        chosen = dict(zip(wanted, picked, strict=True))
        k = max(rows[i].params.logprobs or 0 for i in wanted)
        if k > 0:
            top = torch.topk(raw, k)
            values, indices = top.values.tolist(), top.indices.tolist()
            for j, i in enumerate(wanted):
                n = rows[i].params.logprobs or 0
                tops[i] = list(zip(values[j][:n], indices[j][:n], strict=True))
    ids = tokens.tolist()
    for i, row in enumerate(rows):
        row.record(ids[i], chosen.get(i), tops.get(i, []))
    return ids
