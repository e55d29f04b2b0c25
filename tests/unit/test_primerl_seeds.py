"""The inference adapter's seeds for prime-rl's generate calls: a function of the base seed, the
rollout's weight version, the prompt ids and how many same-key calls came first, never of the
arrival order across prompts or of the trace id. The middleware is driven as ASGI, with the
exact body shape prime-rl's renderers client posts."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests import extras

pytest.importorskip("msgspec", reason=extras.reason("grpo"))

from cortex_recipes.primerl.inference import TaskSeeds, _SeedGenerateRequests

A = [1, 2, 3, 4]
B = [1, 2, 3, 5]


def test_a_groups_seeds_do_not_depend_on_how_other_prompts_interleave():
    first, second = TaskSeeds(0), TaskSeeds(0)
    for _ in range(8):
        first.seed_for(A, "3")
    in_order = [first.seed_for(B, "3") for _ in range(8)]
    interleaved = []
    for _ in range(8):
        interleaved.append(second.seed_for(B, "3"))
        second.seed_for(A, "3")
    assert in_order == interleaved
    assert len(set(in_order)) == 8  # eight distinct draws for a group of eight


def test_seeds_change_with_base_seed_version_and_prompt():
    def group(seeds, prompt, salt):
        return [seeds.seed_for(prompt, salt) for _ in range(4)]

    base = group(TaskSeeds(0), A, "3")
    assert group(TaskSeeds(0), A, "3") == base
    assert set(group(TaskSeeds(1), A, "3")).isdisjoint(base)
    assert set(group(TaskSeeds(0), A, "4")).isdisjoint(base)
    assert set(group(TaskSeeds(0), B, "3")).isdisjoint(base)
    assert all(0 <= s < 2**32 for s in base)


def _post(middleware, body: bytes, path="/inference/v1/generate", chunks=1):
    """Run one request through the middleware; return the body the inner app received."""
    seen = {}

    async def inner(scope, receive, send):
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        seen["body"] = b"".join(parts)
        seen["headers"] = dict(scope["headers"])

    middleware.app = inner
    size = max(1, len(body) // chunks)
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]

    async def receive():
        return messages.pop(0)

    async def send(message):
        pass

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"content-length", str(len(body)).encode())],
    }
    asyncio.run(middleware(scope, receive, send))
    return seen


def _middleware(version=None):
    return _SeedGenerateRequests(None, seeds=TaskSeeds(7), version_of_sampler=lambda: version)


def _body(**sampling):
    return json.dumps(
        {"model": "m", "token_ids": A, "sampling_params": {"temperature": 1.0, **sampling}}
    ).encode()


def test_a_request_without_a_seed_gets_the_task_seed_of_its_cache_salt():
    seen = _post(_middleware(version=9), _body(cache_salt="3"), chunks=3)
    params = json.loads(seen["body"])["sampling_params"]
    assert params["seed"] == TaskSeeds(7).seed_for(A, "3")  # the salt, not the sampler's 9
    assert params["cache_salt"] == "3" and params["temperature"] == 1.0
    assert seen["headers"][b"content-length"] == str(len(seen["body"])).encode()


def test_without_a_cache_salt_the_samplers_version_keys_the_seed():
    expected = TaskSeeds(7)
    assert json.loads(_post(_middleware(version=2), _body())["body"])["sampling_params"][
        "seed"
    ] == expected.seed_for(A, "2")
    base = _post(_middleware(version=None), _body())["body"]
    assert json.loads(base)["sampling_params"]["seed"] == TaskSeeds(7).seed_for(A, "base")


def test_a_callers_seed_and_other_requests_pass_untouched():
    explicit = _body(seed=5, cache_salt="3")
    assert _post(_middleware(), explicit)["body"] == explicit
    for raw in (b"not json", b"[1, 2]", json.dumps({"token_ids": "x"}).encode()):
        assert _post(_middleware(), raw)["body"] == raw
    other = _body(cache_salt="3")
    assert _post(_middleware(), other, path="/v1/models")["body"] == other
