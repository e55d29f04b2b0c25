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


def test_a_forward_or_backward_takes_a_new_thread_count_at_its_next_layer(tmp_path):
    """The worker loop hooks its model's decoder layers: a count the server sends while a long
    op runs is applied inside that op's forward or backward, not only at the next command."""
    import torch
    from transformers import AutoModelForCausalLM

    from cortex_recipes.local.worker import _Loop, repeated_layers
    from cortex_recipes.models.fixtures import build_tiny_qwen3

    build_tiny_qwen3(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    layers = repeated_layers(model)
    assert layers and layers == list(model.model.layers)

    seen: list[int] = []

    class Inbox:
        threads = None

    loop = _Loop.__new__(_Loop)  # only the hook and the inbox it reads
    loop.inbox = Inbox()
    loop.hook_threads(model)
    layers[-1].register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    layers[0].register_forward_pre_hook(lambda *_: setattr(Inbox, "threads", wanted))

    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    try:
        loss = model(torch.tensor([[1, 2, 3]])).logits.sum()
        assert seen == [wanted]  # set by layer 0's message, applied before the last layer
        torch.set_num_threads(before)
        Inbox.threads = wanted  # arrives after the forward: the backward's first layer takes it
        loss.backward()
        assert torch.get_num_threads() == wanted
    finally:
        torch.set_num_threads(before)


def test_layers_are_found_through_a_peft_wrapper(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from cortex_recipes.local.worker import repeated_layers
    from cortex_recipes.models.fixtures import build_tiny_qwen3

    build_tiny_qwen3(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert repeated_layers(wrapped) == list(model.model.layers)
