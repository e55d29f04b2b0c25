"""The sampler under concurrency: N one-row requests sent at once, vs the same N one after
another, vs one N-row request, through SDK -> HTTP -> sampling worker, in one run.

Prints tokens/s of each way and two ratios (higher is better):
- concurrent / serial: what continuous batching buys a client that sends one row per request
  (prime-rl's env-server, the TITO gateway);
- concurrent / one request: how close N separate requests come to one batched request.

Every row is seeded and ignores EOS, so each way samples the same tokens (checked and printed).

    python bench/sampler_concurrency.py --model smollm2-135m-instruct --rows 16 --tokens 32
    python bench/sampler_concurrency.py --device cuda --model <0.6B-shaped> --rows 1 8 64
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from cortex_training import SubJobConfig

from cortex_recipes.local import LocalBackend


def prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, min(vocab, 30000), (n, length), generator=g).tolist()


def params(i: int, tokens: int) -> dict:
    return {"max_tokens": tokens, "temperature": 1.0, "seed": 1000 + i, "ignore_eos": True}


def serial(client, job_id, rows, tokens) -> list[list[int]]:
    out = []
    for i, p in enumerate(rows):
        request = client.generate(job_id, [p], params(i, tokens))
        out.append(client.poll_request(job_id, request)["results"][0]["token_ids"])
    return out


def concurrent(client, job_id, rows, tokens) -> list[list[int]]:
    """Every request in flight at once, each sent and polled by its own client thread."""

    def one(i: int) -> list[int]:
        request = client.generate(job_id, [rows[i]], params(i, tokens))
        return client.poll_request(job_id, request)["results"][0]["token_ids"]

    with ThreadPoolExecutor(max_workers=len(rows)) as pool:
        return list(pool.map(one, range(len(rows))))


def single(client, job_id, rows, tokens) -> list[list[int]]:
    request = client.generate(job_id, rows, [params(i, tokens) for i in range(len(rows))])
    return [r["token_ids"] for r in client.poll_request(job_id, request)["results"]]


WAYS = {"serial": serial, "concurrent": concurrent, "one_request": single}


def measure(client, job_id, n, length, tokens, vocab, repeats) -> dict:
    rows = prompts(n, length, vocab)
    result: dict = {"rows": n}
    outputs = {}
    for name, way in WAYS.items():
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            outputs[name] = way(client, job_id, rows, tokens)
            best = min(best, time.perf_counter() - start)
        result[f"{name}_s"] = round(best, 3)
        result[f"{name}_tokens_per_s"] = round(n * tokens / best, 1)
    result["concurrent_over_serial"] = round(result["serial_s"] / result["concurrent_s"], 2)
    result["concurrent_over_one_request"] = round(
        result["one_request_s"] / result["concurrent_s"], 2
    )
    result["same_tokens_every_way"] = (
        outputs["serial"] == outputs["concurrent"] == outputs["one_request"]
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", nargs="+", default=["tiny-qwen3", "smollm2-135m-instruct"])
    parser.add_argument("--rows", type=int, nargs="+", default=[16])
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many per way")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads per worker")
    parser.add_argument("--dtype", default=None, help="the sampler's dtype (default: per device)")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = parser.parse_args()

    report = {
        "bench": "sampler_concurrency",
        "device": args.device,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "prompt_tokens": args.prompt_tokens,
        "tokens": args.tokens,
        "models": {},
    }
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
    with LocalBackend(device=args.device, threads=args.threads) as backend:
        client = backend.client(poll_interval=0.05, poll_max_interval=0.5, poll_timeout=1800)
        for model in args.model:
            job_id = client.create_job(
                [
                    SubJobConfig.sampling_job(
                        model,
                        max_seq_len=args.prompt_tokens + args.tokens + 8,
                        n_gpus=1,
                        seed=0,
                        **({"dtype": args.dtype} if args.dtype else {}),
                    )
                ]
            )
            client.wait_for_job(job_id)
            vocab = next(
                s["info"]["vocab_size"] for s in client.get_job(job_id)["sub_jobs"] if s.get("info")
            )
            serial(client, job_id, prompts(2, args.prompt_tokens, vocab, seed=99), 4)  # warm up
            runs = []
            for n in args.rows:
                runs.append(
                    measure(client, job_id, n, args.prompt_tokens, args.tokens, vocab, args.repeats)
                )
                print(json.dumps({"model": model, **runs[-1]}), flush=True)
            report["models"][model] = runs
            client.cancel_job(job_id)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
