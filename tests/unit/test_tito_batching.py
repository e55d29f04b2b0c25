"""Lockstep batching of episode turns: every playing episode's next turn goes in one batch, in
a fixed order whatever order the requests arrive in; members that leave are not waited for;
a failed batch fails every turn in it. The sampler behind it is a narrow fake."""

from __future__ import annotations

import random
import threading
import time

import pytest

from cortex_recipes.tito.batching import BatchingError, LockstepBatcher

pytestmark = pytest.mark.unit


class Recorder:
    def __init__(self, fail_on: int | None = None):
        self.batches: list[list[tuple[int, ...]]] = []
        self.fail_on = fail_on

    def __call__(self, prompts, params):
        self.batches.append([tuple(p) for p in prompts])
        if self.fail_on is not None and len(self.batches) == self.fail_on:
            raise RuntimeError("sampler down")
        return [
            {"token_ids": [len(p)], "seed": q["seed"]} for p, q in zip(prompts, params, strict=True)
        ]


def play(batcher: LockstepBatcher, turns: dict[int, int], jitter: random.Random):
    """Episode ``e`` sends ``turns[e]`` requests, each after a random delay."""
    results: dict[int, list] = {e: [] for e in turns}
    errors: list[BaseException] = []
    delays = {e: [jitter.random() * 0.01 for _ in range(n)] for e, n in turns.items()}
    with batcher.playing(len(turns)) as leave:

        def episode(e: int) -> None:
            try:
                for k in range(turns[e]):
                    time.sleep(delays[e][k])
                    out = batcher.generate([e] * (k + 1), {"seed": 100 - e})
                    results[e].append(out)
            except BaseException as exc:  # noqa: BLE001 - collected for the test
                errors.append(exc)
            finally:
                leave()

        threads = [threading.Thread(target=episode, args=(e,)) for e in turns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    return results, errors


def test_each_round_batches_every_playing_episode_in_a_fixed_order():
    turns = {0: 3, 1: 1, 2: 2, 3: 3}
    seen = []
    for trial in range(3):  # different arrival orders, the same batches
        recorder = Recorder()
        with LockstepBatcher(recorder) as batcher:
            results, errors = play(batcher, turns, random.Random(trial))
        assert not errors
        seen.append(recorder.batches)
        assert batcher.batch_sizes == [4, 3, 2]
        assert results[2] == [{"token_ids": [1], "seed": 98}, {"token_ids": [2], "seed": 98}]
    assert seen[0] == seen[1] == seen[2]
    # ordered by the rows' seeds (100 - episode): episode 3 first
    assert seen[0][0] == [(3,), (2,), (1,), (0,)]
    assert seen[0][2] == [(3, 3, 3), (0, 0, 0)]


def test_a_failed_batch_fails_every_turn_in_it_and_the_rest_go_on():
    recorder = Recorder(fail_on=1)
    with LockstepBatcher(recorder) as batcher:
        results, errors = play(batcher, {0: 2, 1: 2}, random.Random(0))
    assert len(errors) == 2 and all(isinstance(e, BatchingError) for e in errors)
    assert "sampler down" in str(errors[0])
    assert results == {0: [], 1: []}


def test_a_request_outside_playing_is_refused():
    with LockstepBatcher(Recorder()) as batcher:
        with pytest.raises(BatchingError, match="no episode playing"):
            batcher.generate([1, 2], {"seed": 0})
        with batcher.playing(1) as leave:
            leave()
            with pytest.raises(BatchingError, match="more often than there are members"):
                leave()
