"""Token-by-token generation with a KV cache: seeded, exact token ids, raw per-token logprobs.

Logprobs are taken from the model's unscaled distribution (before temperature and top-p), which
is what a trainer computes for the same ids; this matches vLLM's ``raw_logprobs`` mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cortex_recipes.local.errors import BackendError

_PARAM_KEYS = {
    "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
    "logprobs", "ignore_eos", "include_stop_str_in_output", "n", "skip_special_tokens",
}  # fmt: skip


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


def parse_sampling_params(raw: Any, where: str = "sampling_params") -> SamplingParams:
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise BackendError(f"{where} must be an object")
    unknown = set(raw) - _PARAM_KEYS
    if unknown:
        raise BackendError(
            f"{where} has unknown keys {sorted(unknown)}; accepted: {', '.join(sorted(_PARAM_KEYS))}"
        )
    if raw.get("n", 1) != 1:
        raise BackendError(f"{where}.n={raw.get('n')!r}: send a prompt n times for n samples")

    def integer(key: str, default, minimum: int):
        value = raw.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise BackendError(f"{where}.{key}={value!r} must be an integer >= {minimum}")
        return value

    def number(key: str, default: float, lo: float, hi: float | None = None) -> float:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value:
            raise BackendError(f"{where}.{key}={value!r} must be a number >= {lo}")
        if hi is not None and value > hi:
            raise BackendError(f"{where}.{key}={value!r} must be <= {hi}")
        return float(value)

    stop = raw.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BackendError(f"{where}.stop={stop!r} must be a string or a list of non-empty strings")
    stop_ids = raw.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in stop_ids
    ):
        raise BackendError(f"{where}.stop_token_ids={stop_ids!r} must be a list of integers")
    return SamplingParams(
        max_tokens=integer("max_tokens", 16, 1),
        temperature=number("temperature", 1.0, 0.0),
        top_p=number("top_p", 1.0, 0.0, 1.0) or 1.0,
        top_k=integer("top_k", 0, -1) or 0,
        seed=integer("seed", None, 0),
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
        logprobs=integer("logprobs", None, 0),
        ignore_eos=bool(raw.get("ignore_eos", False)),
        include_stop_str_in_output=bool(raw.get("include_stop_str_in_output", False)),
        skip_special_tokens=bool(raw.get("skip_special_tokens", True)),
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

    def advance(self, logits: torch.Tensor) -> int:
        """Choose the next token from this row's logits; record it; update the stop state."""
        params = self.params
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        if params.temperature == 0.0:
            token = int(torch.argmax(logits))
        else:
            probs = torch.softmax(_filter_logits(logits, params), dim=-1)
            token = int(torch.multinomial(probs, 1, generator=self.generator))
        self.out_ids.append(token)
        if params.logprobs is not None:
            entry = {str(token): {"logprob": float(raw_logprobs[token])}}
            if params.logprobs > 0:
                top = torch.topk(raw_logprobs, params.logprobs)
                for rank, (lp, tid) in enumerate(
                    zip(top.values.tolist(), top.indices.tolist(), strict=True)
                ):
                    entry.setdefault(str(tid), {"logprob": float(lp)})["rank"] = rank + 1
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
        return token

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
        return result


@torch.no_grad()
def generate_one(
    model,
    tokenizer,
    prompt_ids: list[int],
    params: SamplingParams,
    eos_ids: set[int],
    generator: torch.Generator,
) -> dict[str, Any]:
    """Sample one completion for ``prompt_ids``."""
    device = next(model.parameters()).device
    row = _Row(tokenizer, prompt_ids, params, eos_ids, generator)
    inputs = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    past = None
    while not row.done:
        outputs = model(input_ids=inputs, past_key_values=past, use_cache=True)
        past = outputs.past_key_values
        token = row.advance(outputs.logits[0, -1].float())
        inputs = torch.tensor([[token]], dtype=torch.long, device=device)
    return row.result()


@torch.no_grad()
def generate_batch(
    model,
    tokenizer,
    prompts: list[list[int]],
    params: SamplingParams,
    eos_ids: set[int],
    generators: list[torch.Generator],
    pad_id: int,
) -> list[dict[str, Any]]:
    """Sample one completion per prompt in one batched, left-padded KV-cache loop.

    Every row has its own generator, so a row's sample depends on its seed, not on its
    neighbours. Finished rows are fed padding (masked out) until the last row finishes.
    """
    device = next(model.parameters()).device
    rows = [
        _Row(tokenizer, p, params, eos_ids, g) for p, g in zip(prompts, generators, strict=True)
    ]
    width = max(len(p) for p in prompts)
    inputs = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    attention = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for i, prompt in enumerate(prompts):
        inputs[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention[i, width - len(prompt) :] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    past = None
    while not all(row.done for row in rows):
        outputs = model(
            input_ids=inputs,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
        )
        past = outputs.past_key_values
        logits = outputs.logits[:, -1].float()
        step = [row.advance(logits[i]) if not row.done else pad_id for i, row in enumerate(rows)]
        inputs = torch.tensor([[t] for t in step], dtype=torch.long, device=device)
        attention = torch.cat([attention, torch.ones_like(inputs)], dim=1)
        positions = positions[:, -1:] + 1
    return [row.result() for row in rows]
