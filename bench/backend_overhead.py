"""Overhead of the local backend against the same work done in-process, in one run.

Prints two ratios (lower is better, 1.0 = no overhead):
- SFT step: forward-backward + step through SDK -> HTTP -> worker, vs the same model, batch,
  loss and AdamW step in this process;
- generate: a greedy completion through the server, vs ``model.generate`` in this process.

    python bench/backend_overhead.py --model smollm2-135m-instruct --steps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from cortex_training import SubJobConfig, wire

from cortex_recipes.local import LocalBackend
from cortex_recipes.local.processors import causal_cross_entropy, token_logprobs_and_entropy
from cortex_recipes.models import load_causal_lm

CE = {"loss_fn": "causal_cross_entropy", "post": ["compute_logprobs"], "config": {}}


def batch(rows: int, length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(
        10, min(vocab, 30000), (rows, length), generator=torch.Generator().manual_seed(0)
    )
    mask = torch.ones(rows, length)
    mask[:, -1] = 0
    return ids, mask


def in_process_steps(model_name: str, ids, mask, steps: int, lr: float) -> list[float]:
    torch.manual_seed(0)
    model = load_causal_lm(model_name).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        logits = model(input_ids=ids, use_cache=False).logits
        logprobs, _ = token_logprobs_and_entropy(
            logits, torch.roll(ids, -1, -1), with_entropy=False
        )
        loss, _ = causal_cross_entropy(logprobs, {"loss_mask": mask}, {})
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


def in_process_generate(
    model_name: str, prompt: list[int], tokens: int, repeats: int
) -> list[float]:
    model = load_causal_lm(model_name)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                torch.tensor([prompt]),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
            )
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    vocab = load_causal_lm(args.model).config.vocab_size
    ids, mask = batch(args.rows, args.length, vocab)
    prompt = ids[0, :16].tolist()
    warm = 1

    with LocalBackend(threads=args.threads) as backend:
        client = backend.client(poll_interval=0.005, poll_max_interval=0.02)
        job = client.create_job(
            [
                SubJobConfig.training_job(
                    args.model,
                    optimizer={"name": "AdamW", "lr": 1e-5, "weight_decay": 0.0},
                    max_seq_len=args.length,
                    train_batch_size=args.rows,
                    n_gpus=1,
                    seed=0,
                )
            ]
        )
        client.wait_for_job(job)
        frame = wire.dumps(
            {
                "args": (),
                "kwargs": {"input_ids": ids},
                "context": {"input_ids": ids, "loss_mask": mask},
                "processing": CE,
            }
        )
        server_steps = []
        for _ in range(args.steps + warm):
            start = time.perf_counter()
            client.poll_request(job, client.forward_backward(job, frame))
            client.poll_request(job, client.step(job))
            server_steps.append(time.perf_counter() - start)
        client.cancel_job(job)
        sampler = client.create_job(
            [
                SubJobConfig.sampling_job(
                    args.model, max_seq_len=args.length + args.gen_tokens + 1, n_gpus=1, seed=0
                )
            ]
        )
        client.wait_for_job(sampler)
        params = {"max_tokens": args.gen_tokens, "temperature": 0.0, "ignore_eos": True}
        server_gen = []
        for _ in range(args.steps + warm):
            start = time.perf_counter()
            client.poll_request(sampler, client.generate(sampler, [prompt], params))
            server_gen.append(time.perf_counter() - start)
        client.cancel_job(sampler)

    local_steps = in_process_steps(args.model, ids, mask, args.steps + warm, 1e-5)
    local_gen = in_process_generate(args.model, prompt, args.gen_tokens, args.steps + warm)
    med = lambda xs: statistics.median(xs[warm:])  # noqa: E731
    report = {
        "model": args.model,
        "batch": [args.rows, args.length],
        "threads": args.threads,
        "sft_step_s": {"server": med(server_steps), "in_process": med(local_steps)},
        "sft_step_ratio": med(server_steps) / med(local_steps),
        "generate_s": {"server": med(server_gen), "in_process": med(local_gen)},
        "generate_ratio": med(server_gen) / med(local_gen),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
