"""Conversations -> token ids with per-token supervision weights -> next-token loss masks.

Which tokens train is a named choice (:class:`TrainOnWhat`); a message may carry a ``weight``
(default 1.0) that is preserved, not collapsed, into the mask. Tokens come from the
``renderers`` package: a hand-written renderer for the model family (``renderer="qwen3"``),
or ``renderer="default"``, the package's ``DefaultRenderer``, which renders through the
model's own chat template and attributes tokens to messages incrementally (the choice for a
model without a hand-written renderer, such as SmolLM2's ChatML template). ``chat_template``
renders the template to text here and splits it by character spans of growing prefixes. On
both template paths a template whose renders do not extend each other token for token is
rejected.

Alignment: :func:`render_supervised` gives a token-aligned :class:`cortex_recipes.frames.Row`
(``weights[t]`` = how much predicting token ``t`` counts); :func:`collate` batches rows through
:func:`cortex_recipes.frames.pad_batch`, whose :func:`~cortex_recipes.frames.shift` is the one
place that turns them into the prediction-aligned ``loss_mask`` the processors expect (column
``i`` weights token ``i + 1``; the last column is 0).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cortex_recipes.frames import Batch, Row, pad_batch, shift

log = logging.getLogger(__name__)

CHAT_TEMPLATE = "chat_template"
DEFAULT = "default"  # renderers' DefaultRenderer: the model's own chat template, as ids
RENDERERS = ("qwen3", DEFAULT, CHAT_TEMPLATE)


class TrainOnWhat(StrEnum):
    ALL_ASSISTANT_MESSAGES = "all_assistant_messages"
    LAST_ASSISTANT_MESSAGE = "last_assistant_message"


class SupervisionError(ValueError):
    """A conversation or template that cannot be supervised as asked."""


def make_renderer(tokenizer, name: str):
    """A ``renderers`` renderer for ``name``, or ``None`` for the tokenizer's chat template."""
    if name == CHAT_TEMPLATE:
        return None
    if name == "qwen3":
        from renderers import create_renderer
        from renderers.configs import Qwen3RendererConfig

        return create_renderer(tokenizer, Qwen3RendererConfig())
    if name == DEFAULT:
        from renderers import create_renderer
        from renderers.configs import DefaultRendererConfig

        return create_renderer(tokenizer, DefaultRendererConfig())
    raise SupervisionError(f"renderer={name!r}; accepted: {', '.join(RENDERERS)}")


def message_weights(messages: Sequence[dict[str, Any]], train_on: TrainOnWhat) -> list[float]:
    """Weight of each message under ``train_on``; non-assistant messages are always 0."""
    train_on = TrainOnWhat(train_on)
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    selected = set(assistant[-1:] if train_on is TrainOnWhat.LAST_ASSISTANT_MESSAGE else assistant)
    weights = []
    for i, message in enumerate(messages):
        weight = message.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise SupervisionError(f"messages[{i}].weight={weight!r} must be a number")
        if not math.isfinite(weight) or weight < 0:
            raise SupervisionError(f"messages[{i}].weight={weight!r} must be finite and >= 0")
        weights.append(float(weight) if i in selected else 0.0)
    return weights


def _without_weights(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != "weight"} for m in messages]


def _template_text(tokenizer, messages, *, add_generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _template_supervised(tokenizer, messages, per_message: list[float]) -> Row:
    """Split a chat-template render per message by character spans of growing prefixes."""
    full = _template_text(tokenizer, messages, add_generation_prompt=False)
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    weights = [0.0] * len(ids)
    eos = tokenizer.eos_token_id
    for i, weight in enumerate(per_message):
        if weight == 0.0:
            continue
        context = _template_text(tokenizer, messages[:i], add_generation_prompt=True)
        upto = _template_text(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not upto.startswith(context) or not full.startswith(upto):
            raise SupervisionError(
                f"the chat template does not extend its earlier render at messages[{i}]: the "
                "text of earlier turns changes when later turns are added, so the assistant "
                "turn cannot be located; use a renderer for this model"
            )
        # A token belongs to the turn when it starts inside it (a token merged across the
        # boundary stays context). Train through the turn-closing token, not after it.
        span = [t for t, (start, _) in enumerate(offsets) if len(context) <= start < len(upto)]
        closes = [t for t in span if ids[t] == eos]
        for t in span[: span.index(closes[-1]) + 1] if closes else span:
            weights[t] = weight
    return Row(ids, weights)


def render_supervised(
    messages: Sequence[dict[str, Any]],
    tokenizer,
    renderer,
    train_on: TrainOnWhat,
    *,
    tools: Sequence[dict[str, Any]] | None = None,
) -> Row:
    """Token ids of ``messages`` and token-aligned supervision weights.

    ``tools`` (OpenAI function-tool declarations) are rendered into the system prompt the way
    the model will see them at inference; they need a renderer.
    """
    if not messages:
        raise SupervisionError("a conversation needs at least one message")
    per_message = message_weights(messages, train_on)
    clean = _without_weights(messages)
    if renderer is None:
        if tools:
            raise SupervisionError(
                "tool declarations need a renderers renderer (renderer='qwen3' or 'default')"
            )
        return _template_supervised(tokenizer, clean, per_message)
    rendered = renderer.render(clean, tools=list(tools)) if tools else renderer.render(clean)
    ids = list(rendered.token_ids)
    sampled = list(rendered.sampled_mask) or _sampled_by_prefixes(renderer, clean, ids, tools)
    weights = [
        per_message[m] if s and m >= 0 else 0.0
        for m, s in zip(rendered.message_indices, sampled, strict=True)
    ]
    return Row(ids, weights)


def _sampled_by_prefixes(renderer, messages, ids: list[int], tools) -> list[bool]:
    """Which tokens the model would sample, for a renderer that does not say (an empty
    ``sampled_mask``: ``DefaultRenderer`` wraps an opaque template).

    An assistant turn's sampled tokens are those after the generation prompt of the turns
    before it, through the turn-closing stop token; the opener (``<|im_start|>assistant``),
    a token merged across its end, and what follows the close stay context. Each prefix render must be a token prefix of the
    full render, otherwise the renderer's incremental message attribution is wrong too.
    """
    kwargs = {"tools": list(tools)} if tools else {}
    stops = set(renderer.get_stop_token_ids())
    sampled = [False] * len(ids)
    previous: list[int] = []
    for i, message in enumerate(messages):
        assistant = message.get("role") == "assistant"
        upto = renderer.render_ids(list(messages[: i + 1]), **kwargs)
        where = f"messages[{i}] cannot be located; use a hand-written renderer for this model"
        if upto[: len(previous)] != previous:
            raise SupervisionError(
                f"renderer={type(renderer).__name__}: the render of messages[:{i + 1}] does not "
                f"extend the render of its earlier turns token for token, so {where}"
            )
        if ids[: len(upto)] != upto:
            raise SupervisionError(
                f"renderer={type(renderer).__name__}: the render of all {len(messages)} "
                f"messages does not extend the render of messages[:{i + 1}] token for token, "
                f"so {where}"
            )
        start = len(upto)
        if assistant:
            prompt = (
                renderer.render_ids(list(messages[:i]), add_generation_prompt=True, **kwargs)
                if i
                else []
            )
            start = len(prompt)
            if upto[:start] != prompt:
                # A token merged across the end of the generation prompt ("\n" + "  x") stays
                # context, as on the chat_template path; any other difference is a rewrite.
                start = len(prompt) - 1
                if start < 0 or upto[:start] != prompt[:start]:
                    raise SupervisionError(
                        f"renderer={type(renderer).__name__}: the render of messages[:{i + 1}] "
                        "does not extend the render of its generation prompt token for token, "
                        f"so {where}"
                    )
                start += 1
        previous = upto
        if not assistant:
            continue
        span = range(start, len(upto))
        closes = [t for t in span if ids[t] in stops]
        for t in range(start, closes[-1] + 1 if closes else len(upto)):
            sampled[t] = True
    return sampled


def truncate(example: Row, max_seq_len: int) -> Row:
    """Keep the first ``max_seq_len`` tokens with their own weights."""
    return Row(example.token_ids[:max_seq_len], example.weights[:max_seq_len])


@dataclass(frozen=True)
class SFTBatch(Batch):
    n_dropped: int = 0  # examples with no supervised token left (never sent)
    n_truncated: int = 0


def collate(examples: Sequence[Row], *, pad_id: int, max_seq_len: int) -> SFTBatch:
    """Truncate, drop unsupervised examples, right-pad, and build the next-token mask."""
    rows: list[Row] = []
    dropped = truncated = 0
    for example in examples:
        if len(example.token_ids) > max_seq_len:
            truncated += 1
        cut = truncate(example, max_seq_len)
        if not any(w > 0 for w in shift(cut.weights)):
            dropped += 1
            continue
        rows.append(cut)
    if dropped:
        log.info("dropped %d example(s) with no supervised token after truncation", dropped)
    if not rows:
        raise SupervisionError(
            f"no example in this batch of {len(examples)} has a supervised token"
        )
    batch = pad_batch(rows, pad_id)
    return SFTBatch(batch.input_ids, batch.loss_mask, n_dropped=dropped, n_truncated=truncated)
