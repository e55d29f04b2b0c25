"""Continuous batching for a sampling worker: rows join and leave one running KV-cache batch
between decode steps.

Invariants:
- A worker has one running batch: a left-padded KV cache (a ``DynamicCache`` of full-attention
  layers), its attention mask, and one slot per row holding the token the row feeds next and
  that token's position id. Every row keeps its own sampling parameters and generator
  (:mod:`cortex_recipes.local.decoding`), so requests with different parameters share a step.
- Rows wait in arrival order. At each step boundary as many as fit are admitted: at most
  ``max_rows`` rows run at once, and the running rows' ``prompt + max_tokens`` sum to at most
  ``max_tokens`` (a single larger row still runs, alone). Admitted rows are prefilled together
  (in groups of at most ``prefill_tokens`` padded tokens) and merged into the batch, the
  shorter side left-padded.
- A row leaves the batch the step it finishes; a request is finished when its last row is, and
  is handed back at once. Leading cache columns that no remaining row attends to are dropped.
- :meth:`Batcher.cancel` drops a request's waiting and running rows; nothing of it is returned.
- A failed step fails the requests whose rows were in it and empties the batch; requests still
  waiting are untouched.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from cortex_recipes.local.decoding import _advance, _Row
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.specs import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS

# A group's common prompt prefix at least this long runs once (Batcher._prefill_distinct).
MIN_SHARED_PREFIX = 8


@dataclass(frozen=True)
class Limits:
    """How much one sampling worker decodes at once (per sub-job, from its inference_config)."""

    max_rows: int = DEFAULT_MAX_NUM_SEQS
    max_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    prefill_tokens: int = 8192


@dataclass
class Pending:
    """One generate request: its rows, in the order of its prompts."""

    key: Any
    rows: list[_Row]
    unfinished: int = 0
    started_at: float | None = None
    header: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.unfinished = len(self.rows)


@dataclass
class _Slot:
    row: _Row
    request: Pending
    token: int  # the sampled token this row feeds at the next step
    position: int  # that token's position id


class StepFailed(RuntimeError):
    """A prefill or decode step raised; ``requests`` lost their rows and must be failed."""

    def __init__(self, requests: list[Pending], cause: BaseException):
        super().__init__(str(cause))
        self.requests = requests
        self.cause = cause


def _row_tokens(row: _Row) -> int:
    return len(row.prompt_ids) + row.params.max_tokens


def common_prefix(prompts: list[list[int]]) -> int:
    """The longest prefix every prompt shares, short of the shortest prompt's last token (so
    each prompt keeps a token of its own to predict from)."""
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def _left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` ([batch, heads, seq, dim]) with ``n`` zero columns before its sequence."""
    return F.pad(t, (0, 0, n, 0)) if n else t


class Batcher:
    def __init__(self, model, pad_id: int, limits: Limits = Limits()):
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        self.limits = limits
        self.waiting: deque[tuple[Pending, _Row]] = deque()
        self.slots: list[_Slot] = []
        self.cache = None
        self.attention: torch.Tensor | None = None
        self.steps = 0

    @property
    def busy(self) -> bool:
        return bool(self.slots or self.waiting)

    @property
    def running_tokens(self) -> int:
        return sum(_row_tokens(s.row) for s in self.slots)

    def add(self, request: Pending) -> None:
        self.waiting.extend((request, row) for row in request.rows)

    def cancel(self, key: Any) -> Pending | None:
        """Drop every row of the request ``key``; the request, or None when it is not here."""
        found = None
        kept: deque[tuple[Pending, _Row]] = deque()
        for request, row in self.waiting:
            if request.key == key:
                found = request
            else:
                kept.append((request, row))
        self.waiting = kept
        for slot in self.slots:
            if slot.request.key == key:
                found = slot.request
                slot.row.done = True
        if found is not None:
            found.unfinished = -1  # never reported finished
            self._drop_finished()
        return found

    # -- one step ------------------------------------------------------------------------------

    def step(self, version: int) -> list[Pending]:
        """Admit what fits, decode one token for every running row, and return the requests
        that finished. Raises :class:`StepFailed` naming the requests a failure cost."""
        finished: list[Pending] = []
        admitted = self._admit()
        if admitted:
            try:
                self._prefill(admitted, version, finished)
            except Exception as exc:
                raise StepFailed(self._fail_batch(admitted), exc) from exc
        elif self.slots:
            try:
                self._decode(version, finished)
            except Exception as exc:
                raise StepFailed(self._fail_batch([]), exc) from exc
        return finished

    def _admit(self) -> list[tuple[Pending, _Row]]:
        admitted: list[tuple[Pending, _Row]] = []
        rows, tokens = len(self.slots), self.running_tokens
        while self.waiting:
            request, row = self.waiting[0]
            need = _row_tokens(row)
            alone = rows == 0
            if not alone and (
                rows + 1 > self.limits.max_rows or tokens + need > self.limits.max_tokens
            ):
                break
            self.waiting.popleft()
            admitted.append((request, row))
            rows, tokens = rows + 1, tokens + need
        return admitted

    @torch.no_grad()
    def _prefill(self, admitted, version: int, finished: list[Pending]) -> None:
        now = time.time()
        for request, _ in admitted:
            if request.started_at is None:
                request.started_at = now
        group: list[tuple[Pending, _Row]] = []
        width = 0
        for item in admitted:
            w = max(width, len(item[1].prompt_ids))
            if group and w * (len(group) + 1) > self.limits.prefill_tokens:
                self._prefill_group(group, version)
                group, w = [], len(item[1].prompt_ids)
            group.append(item)
            width = w
        if group:
            self._prefill_group(group, version)
        self._drop_finished(finished)

    def _prefill_group(self, group, version: int) -> None:
        prompts = [row.prompt_ids for _, row in group]
        distinct: dict[tuple[int, ...], int] = {}
        which = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        logits, cache, attention = self._prefill_distinct([list(p) for p in distinct])
        if len(distinct) < len(prompts):  # each row gets its prompt's logits and cache
            index = torch.tensor(which, dtype=torch.long, device=self.device)
            logits, attention = logits.index_select(0, index), attention.index_select(0, index)
            for layer in cache.layers:
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
        for layer in cache.layers:
            if type(layer) is not DynamicLayer:
                raise BackendError(
                    f"continuous batching needs full-attention cache layers; this model has "
                    f"{type(layer).__name__}"
                )
        rows = [row for _, row in group]
        for row in rows:
            row.note_version(version)
        tokens = _advance(rows, logits.float())
        self._merge(cache, attention)
        for (request, row), token, prompt in zip(group, tokens, prompts, strict=True):
            self.slots.append(_Slot(row, request, token, len(prompt)))

    def _prefill_distinct(self, prompts: list[list[int]]):
        """The last position's logits, the cache and its attention mask of ``prompts`` (all
        different). Their longest common prefix, when at least :data:`MIN_SHARED_PREFIX` tokens,
        runs once and each prompt's rest after it: the cache is then ``[prefix | left-padded
        rest]``, the padding masked, each rest at its true positions."""
        shared = common_prefix(prompts) if len(prompts) > 1 else 0
        if shared < MIN_SHARED_PREFIX:
            width = max(len(p) for p in prompts)
            inputs = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
            attention = torch.zeros((len(prompts), width), dtype=torch.long)
            for i, prompt in enumerate(prompts):
                inputs[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
                attention[i, width - len(prompt) :] = 1
            inputs, attention = inputs.to(self.device), attention.to(self.device)
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
            outputs = self.model(
                input_ids=inputs, attention_mask=attention, position_ids=positions,
                use_cache=True, logits_to_keep=1,
            )  # fmt: skip
            return outputs.logits[:, -1], outputs.cache, attention
        n = len(prompts)
        prefix = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=self.device)
        head = self.model(
            input_ids=prefix,
            attention_mask=torch.ones_like(prefix),
            position_ids=torch.arange(shared, device=self.device).unsqueeze(0),
            use_cache=True,
            logits_to_keep=1,
        )
        cache = head.cache
        for layer in cache.layers:  # one copy of the prefix per prompt, by view
            layer.keys = layer.keys.expand(n, -1, -1, -1)
            layer.values = layer.values.expand(n, -1, -1, -1)
        rests = [p[shared:] for p in prompts]
        width = max(len(r) for r in rests)
        inputs = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        positions = torch.zeros((n, width), dtype=torch.long)
        for i, rest in enumerate(rests):
            inputs[i, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            mask[i, width - len(rest) :] = 1
            positions[i, width - len(rest) :] = torch.arange(shared, shared + len(rest))
        attention = torch.cat([torch.ones((n, shared), dtype=torch.long), mask], dim=1)
        attention = attention.to(self.device)
        outputs = self.model(
            input_ids=inputs.to(self.device), attention_mask=attention,
            position_ids=positions.to(self.device), cache=cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        return outputs.logits[:, -1], outputs.cache, attention

    def _merge(self, cache, attention: torch.Tensor) -> None:
        if self.cache is None:
            self.cache, self.attention = cache, attention
            return
        old, new = self.attention.shape[1], attention.shape[1]
        width = max(old, new)
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat(
                [_left_pad(mine.keys, width - old), _left_pad(theirs.keys, width - new)]
            )
            mine.values = torch.cat(
                [_left_pad(mine.values, width - old), _left_pad(theirs.values, width - new)]
            )
        self.attention = torch.cat(
            [F.pad(self.attention, (width - old, 0)), F.pad(attention, (width - new, 0))]
        )

    @torch.no_grad()
    def _decode(self, version: int, finished: list[Pending]) -> None:
        inputs = torch.tensor([[s.token] for s in self.slots], dtype=torch.long)
        positions = torch.tensor([[s.position] for s in self.slots], dtype=torch.long)
        attention = torch.cat(
            [
                self.attention,
                torch.ones((len(self.slots), 1), dtype=torch.long, device=self.device),
            ],
            dim=1,
        )
        outputs = self.model(
            input_ids=inputs.to(self.device),
            attention_mask=attention,
            position_ids=positions.to(self.device),
            cache=self.cache,
            use_cache=True,
        )
        self.cache, self.attention = outputs.cache, attention
        rows = [s.row for s in self.slots]
        for row in rows:
            row.note_version(version)
        tokens = _advance(rows, outputs.logits[:, -1].float())
        for slot, token in zip(self.slots, tokens, strict=True):
            slot.token, slot.position = token, slot.position + 1
        self.steps += 1
        self._drop_finished(finished)

    # -- leaving -------------------------------------------------------------------------------

    def _drop_finished(self, finished: list[Pending] | None = None) -> None:
        keep = [i for i, s in enumerate(self.slots) if not s.row.done]
        for slot in self.slots:
            if slot.row.done and slot.request.unfinished > 0:
                slot.request.unfinished -= 1
                if slot.request.unfinished == 0 and finished is not None:
                    finished.append(slot.request)
        if len(keep) == len(self.slots):
            return
        self.slots = [self.slots[i] for i in keep]
        if not keep:
            self.cache = self.attention = None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        attention = self.attention.index_select(0, index)
        first = int(attention.bool().any(dim=0).int().argmax())  # first column anyone attends
        self.attention = attention[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]

    def _fail_batch(self, admitted) -> list[Pending]:
        lost: list[Pending] = []
        for request in [s.request for s in self.slots] + [r for r, _ in admitted]:
            if request not in lost:
                lost.append(request)
        keys = {id(r) for r in lost}
        self.waiting = deque((r, row) for r, row in self.waiting if id(r) not in keys)
        self.slots, self.cache, self.attention = [], None, None
        for request in lost:
            request.unfinished = -1
        return lost
