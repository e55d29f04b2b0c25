"""CPU cores shared among the busy workers: all of them to a lone busy worker, split when
several are busy, given back when one goes idle."""

from __future__ import annotations

import pytest

from cortex_recipes.local.cores import CoreBalancer

pytestmark = pytest.mark.unit


class Worker:
    def __init__(self):
        self.told: list[int] = []

    def set_threads(self, n: int) -> None:
        self.told.append(n)


def test_a_lone_busy_worker_gets_every_core_and_two_busy_ones_split_them():
    cores = CoreBalancer(cores=4)
    sampler, trainer = Worker(), Worker()
    cores.busy(sampler)
    assert sampler.told == [4]
    cores.busy(trainer)
    assert sampler.told == [4, 2] and trainer.told == [2]
    cores.idle(sampler)
    assert trainer.told == [2, 4] and sampler.told == [4, 2]
    cores.busy(sampler)  # busy again: told its share, the other told to shrink
    assert sampler.told[-1] == 2 and trainer.told[-1] == 2


def test_repeated_busy_or_idle_calls_change_nothing_and_every_worker_gets_a_thread():
    cores = CoreBalancer(cores=2)
    workers = [Worker() for _ in range(3)]
    for w in workers:
        cores.busy(w)
    cores.busy(workers[0])
    assert [w.told[-1] for w in workers] == [1, 1, 1]
    assert workers[0].told == [2, 1]
    cores.idle(workers[1])
    cores.idle(workers[1])
    assert workers[0].told == [2, 1] and workers[2].told == [1]
    assert cores.share() == 1
    cores.idle(workers[0])
    assert workers[2].told == [1, 2] and cores.share() == 2
