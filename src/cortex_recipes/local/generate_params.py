"""``generate`` frames: the prompts (text or token ids, bounded in number and size) and the
sampling parameters, normalised into :class:`GenerateRow` s and
:class:`~cortex_recipes.local.decoding.SamplingParams` the sampling worker trusts. The one
thing only the worker can check is a text prompt's token length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cortex_recipes.local.bodies import MAX_ABS_INT, MAX_TEMPERATURE, boolean, integer, number
from cortex_recipes.local.decoding import SamplingParams
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.specs import (
    MAX_SEED,
    abridge,
    reject_unknown_keys,
)

# vLLM's default max_logprobs; more is a mistake, not a request.
MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_PROMPTS = 4096
MAX_PROMPT_CHARS = 1 << 20

# ---------------------------------------------------------------------------------------------
# Generate
# ---------------------------------------------------------------------------------------------

SAMPLING_KEYS = {
    "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
    "logprobs", "ignore_eos", "include_stop_str_in_output", "n", "skip_special_tokens",
}  # fmt: skip
GENERATE_KEYS = {"prompts", "sampling_params", "routing_key", "strict"}


def parse_sampling_params(
    raw: Any, where: str = "sampling_params", *, vocab: int | None = None
) -> SamplingParams:
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise BackendError(f"{where} must be an object")
    reject_unknown_keys(raw, SAMPLING_KEYS, where)
    if raw.get("n", 1) != 1 or isinstance(raw.get("n", 1), bool):
        raise BackendError(
            f"{where}.n={abridge(raw.get('n'))}: send a prompt n times for n samples"
        )
    stop = raw.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_STRING_CHARS for s in stop)
    ):
        raise BackendError(
            f"{where}.stop={abridge(stop)} must be a string or a list of at most "
            f"{MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_STRING_CHARS} characters"
        )
    stop_ids = raw.get("stop_token_ids") or []
    top_id = (vocab or MAX_ABS_INT + 1) - 1
    if not isinstance(stop_ids, list) or len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise BackendError(
            f"{where}.stop_token_ids={abridge(stop_ids)} must be a list of at most "
            f"{MAX_STOP_TOKEN_IDS} token ids"
        )
    for i, token in enumerate(stop_ids):
        integer(token, f"{where}.stop_token_ids[{i}]", minimum=0, maximum=top_id)
    max_tokens = integer(raw.get("max_tokens", 16), f"{where}.max_tokens", minimum=1)
    top_k = integer(raw.get("top_k", 0), f"{where}.top_k", minimum=-1, maximum=top_id + 1)
    seed = raw.get("seed")
    logprobs = raw.get("logprobs")
    flags = {}
    for flag, default in (
        ("ignore_eos", False),
        ("include_stop_str_in_output", False),
        ("skip_special_tokens", True),
    ):
        flags[flag] = boolean(raw.get(flag, default), f"{where}.{flag}")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=float(
            number(
                raw.get("temperature", 1.0),
                f"{where}.temperature",
                minimum=0.0,
                maximum=MAX_TEMPERATURE,
            )
        ),
        top_p=float(number(raw.get("top_p", 1.0), f"{where}.top_p", minimum=0.0, maximum=1.0))
        or 1.0,
        top_k=max(top_k, 0),
        seed=None if seed is None else integer(seed, f"{where}.seed", minimum=0, maximum=MAX_SEED),
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
        logprobs=None
        if logprobs is None
        else integer(logprobs, f"{where}.logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS),
        **flags,
    )


@dataclass(frozen=True)
class GenerateRow:
    """One prompt of a generate request: its text or token ids and its parameters."""

    prompt: str | list[int]
    params: SamplingParams

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "params": self.params.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerateRow:
        return cls(data["prompt"], SamplingParams.from_json(data["params"]))


def validate_generate(frame: Any, *, max_seq_len: int, vocab: int | None) -> list[GenerateRow]:
    if not isinstance(frame, dict) or "prompts" not in frame:
        raise BackendError("generate frame must be an object with prompts")
    reject_unknown_keys(frame, GENERATE_KEYS, "generate frame")
    prompts = frame["prompts"]
    if not isinstance(prompts, list) or not 0 < len(prompts) <= MAX_PROMPTS:
        raise BackendError(
            f"prompts must be a non-empty list of at most {MAX_PROMPTS} strings or token-id lists"
        )
    params = frame.get("sampling_params")
    if isinstance(params, list) and len(params) != len(prompts):
        raise BackendError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
    shared = None if isinstance(params, list) else parse_sampling_params(params, vocab=vocab)
    rows = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if not 0 < len(prompt) <= MAX_PROMPT_CHARS:
                raise BackendError(
                    f"prompts[{i}] must be a non-empty string of at most {MAX_PROMPT_CHARS} chars"
                )
        else:
            if (
                not isinstance(prompt, list)
                or not prompt
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            ):
                raise BackendError(
                    f"prompts[{i}] must be a string or a non-empty list of token ids"
                )
            low, high = min(prompt), max(prompt)
            if low < 0 or (vocab and high >= vocab) or high > MAX_ABS_INT:
                raise BackendError(
                    f"prompts[{i}] has token ids outside [0, {vocab or 'vocab'}): "
                    f"min {low}, max {abridge(high)}"
                )
            if len(prompt) >= max_seq_len:
                raise BackendError(
                    f"prompts[{i}] has {len(prompt)} tokens; must be shorter than max_seq_len "
                    f"{max_seq_len}"
                )
        row_params = (
            parse_sampling_params(params[i], f"sampling_params[{i}]", vocab=vocab)
            if shared is None
            else shared
        )
        if not isinstance(prompt, str):
            budget = max_seq_len - len(prompt)
            if row_params.max_tokens > budget:
                row_params = replace(row_params, max_tokens=budget)
        rows.append(GenerateRow(prompt, row_params))
    if frame.get("routing_key") is not None and not isinstance(frame["routing_key"], str):
        raise BackendError(f"routing_key={abridge(frame['routing_key'])} must be a string")
    return rows
