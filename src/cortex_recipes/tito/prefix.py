"""Reject renderers and environments that cannot extend a conversation token for token.

Token-in/token-out training requires every turn's prompt to be exactly the previous prompt
plus the sampled completion plus newly rendered tokens. :func:`check_linear_history` plays
a reference conversation (the environment's own demonstration) through the renderer before
any training. For each later turn, the renderer's ``bridge_to_next_turn`` must produce a
prompt that extends the previous prompt + completion. A renderer without a token-exact
bridge, or one that would rewrite earlier tokens, is refused with an error naming the turn.
An example is the chat-template ``DefaultRenderer``: a template that strips earlier reasoning
or tool calls cannot be extended.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


class TemplateExtensionError(ValueError):
    """The renderer/template cannot extend this environment's turns token for token."""


def _ids(rendered) -> list[int]:
    return list(rendered.token_ids)


def check_linear_history(
    renderer, conversation: Sequence[dict[str, Any]], tools: Sequence[dict] | None = None
) -> dict[str, Any]:
    """Raise :class:`TemplateExtensionError` unless every assistant turn after the first can be
    reached by bridging; return what was checked (turns, and whether full re-rendering would
    also have extended, which is informational)."""
    name = type(renderer).__name__
    assistant_turns = [i for i, m in enumerate(conversation) if m.get("role") == "assistant"]
    if len(assistant_turns) < 2:
        raise TemplateExtensionError(
            "the reference conversation needs at least two assistant turns to check extension"
        )
    tools = list(tools) if tools else None
    report = {"renderer": name, "turns": len(assistant_turns), "full_render_extends": True}
    prompt: list[int] | None = None
    completion: list[int] | None = None
    previous_end = 0
    for k, i in enumerate(assistant_turns):
        turn_prompt = _ids(
            renderer.render(list(conversation[:i]), tools=tools, add_generation_prompt=True)
        )
        full = _ids(renderer.render(list(conversation[: i + 1]), tools=tools))
        if full[: len(turn_prompt)] != turn_prompt:
            raise TemplateExtensionError(
                f"{name}: assistant message {i} cannot be separated from its prompt: the render "
                "with the reply does not start with the render that asks for it"
            )
        if k > 0:
            tail = list(conversation[previous_end:i])
            if any(m.get("role") == "assistant" for m in tail):
                raise TemplateExtensionError(
                    f"messages {previous_end}..{i - 1}: assistant in a tail"
                )
            bridged = renderer.bridge_to_next_turn(prompt, completion, tail, tools=tools)
            if bridged is None:
                raise TemplateExtensionError(
                    f"{name} cannot bridge to assistant message {i} (turn {k}) token for token: "
                    "the next prompt would have to be re-rendered, and re-rendering can change "
                    "tokens already sampled. Use a renderer with an exact bridge (renderer='qwen3')"
                )
            anchor = prompt + completion
            if _ids(bridged)[: len(anchor)] != anchor:
                raise TemplateExtensionError(
                    f"{name}: the bridged prompt for assistant message {i} does not extend the "
                    "previous prompt + completion"
                )
            if turn_prompt[: len(anchor)] != anchor:
                report["full_render_extends"] = False
        prompt, completion = turn_prompt, full[len(turn_prompt) :]
        previous_end = i + 1
    if not report["full_render_extends"]:
        log.info("%s: full re-rendering would rewrite history; the bridge keeps turns exact", name)
    return report
