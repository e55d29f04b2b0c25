"""The local backend's GPU path against the same work done in-process, in one run.

Prints one JSON object (and writes it to ``--out``):
- ``sft``: forward-backward + step (weighted next-token NLL, backward, grad norm, AdamW)
  through SDK -> HTTP -> worker over the same step in this process. Target: ratio <= 1.10 for
  the Qwen3-0.6B-shaped model at batch 8 x 512 in bf16.
- ``sampling``: greedy tokens/s of a batched ``generate`` through the server over
  ``model.generate`` in this process. Target: ratio >= 0.90 for 8 prompts x 128 new tokens.
- absolute tokens/s and model-FLOPs utilisation for both: ``6 * N * tokens/s`` for training,
  ``2 * N * tokens/s`` for sampling, over ``--peak-tflops`` (the H200's ~790 TFLOP/s bf16 on
  CUDA; none on the CPU). ``N`` counts every parameter once; with tied embeddings that is the
  LM head's matmul, which every token pays.
- ``weight_sync``: seconds to move the trainer's full weights to the sampler.

Times are medians after ``--warmup`` untimed repeats; only ratios taken in one run mean much.

    python bench/gpu_bench.py --device cuda --out /tmp/gpu_bench.json   # Qwen3-0.6B shape, bf16
    python bench/gpu_bench.py --device cpu                              # tiny-qwen3, small sizes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from cortex_training import SubJobConfig, wire

from cortex_recipes.local import LocalBackend
from cortex_recipes.local.processors import causal_cross_entropy, token_logprobs_and_entropy
from cortex_recipes.models import load_causal_lm, resolve_model_path
from cortex_recipes.models.cache import build_once

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_models import build_qwen3_0_6b_shape  # noqa: E402

QWEN3_0_6B_SHAPE = "qwen3-0.6b-shape"
CE = {"loss_fn": "causal_cross_entropy", "post": ["compute_logprobs"], "config": {}}
# Per device: the sizes the issue asks for on the GPU, and ones a 2-core CPU runs in a minute.
DEFAULTS = {
    "cuda": {
        "model": QWEN3_0_6B_SHAPE,
        "dtype": "bfloat16",
        "rows": 8,
        "length": 512,
        "prompts": 8,
        "prompt_tokens": 64,
        "new_tokens": 128,
        "peak_tflops": 790.0,
    },
    "cpu": {
        "model": "tiny-qwen3",
        "dtype": "float32",
        "rows": 2,
        "length": 128,
        "prompts": 4,
        "prompt_tokens": 16,
        "new_tokens": 16,
        "peak_tflops": None,
    },
}
SFT_RATIO_MAX = 1.10
SAMPLING_RATIO_MIN = 0.90


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=sorted(DEFAULTS), default="cuda")
    parser.add_argument(
        "--model",
        help=f"fixture name, model directory, or {QWEN3_0_6B_SHAPE!r} (built into --models-dir)",
    )
    parser.add_argument("--models-dir", type=Path, help="where to build qwen3-0.6b-shape")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--rows", type=int, help="SFT batch rows")
    parser.add_argument("--length", type=int, help="SFT tokens per row")
    parser.add_argument("--prompts", type=int, help="prompts per generate")
    parser.add_argument("--prompt-tokens", type=int, help="tokens per prompt")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per prompt")
    parser.add_argument("--peak-tflops", type=float, help="peak for MFU (default: 790 on cuda)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed repeats before timing")
    parser.add_argument("--sync-repeats", type=int, default=3, help="timed weight syncs")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    return args


def model_path(args: argparse.Namespace) -> Path:
    if args.model != QWEN3_0_6B_SHAPE:
        return resolve_model_path(args.model)
    root = args.models_dir or Path(tempfile.gettempdir()) / "cortex-recipes-bench-models"
    return build_once(root / QWEN3_0_6B_SHAPE, build_qwen3_0_6b_shape)


def sft_batch(rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(10, 30000, (rows, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, length)
    mask[:, -1] = 0
    return ids, mask


def prompt_batch(rows: int, length: int) -> torch.Tensor:
    return torch.randint(10, 30000, (rows, length), generator=torch.Generator().manual_seed(1))


def timed(fn: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def through_server(args, path: Path, ids, mask, prompts) -> dict:
    max_seq_len = max(args.length, args.prompt_tokens + args.new_tokens + 1)
    with LocalBackend(device=args.device, threads=args.threads) as backend:
        client = backend.client(poll_interval=0.005, poll_max_interval=0.02)
        job = client.create_job(
            [
                SubJobConfig.training_job(
                    str(path),
                    optimizer={"name": "AdamW", "lr": 1e-5, "weight_decay": 0.0},
                    max_seq_len=max_seq_len,
                    train_batch_size=args.rows,
                    n_gpus=1,
                    dtype=args.dtype,
                    seed=0,
                ),
                SubJobConfig.sampling_job(
                    str(path), max_seq_len=max_seq_len, n_gpus=1, dtype=args.dtype, seed=0
                ),
            ]
        )
        described = client.wait_for_job(job)
        placed = {
            s["job_type"]: {"device": s.get("device"), "dtype": s.get("dtype")}
            for s in described["sub_jobs"]
        }
        frame = wire.dumps(
            {
                "args": (),
                "kwargs": {"input_ids": ids},
                "context": {"input_ids": ids, "loss_mask": mask},
                "processing": CE,
            }
        )

        def sft_step() -> None:
            client.poll_request(job, client.forward_backward(job, frame))
            client.poll_request(job, client.step(job))

        params = {"max_tokens": args.new_tokens, "temperature": 0.0, "ignore_eos": True}
        rows = prompts.tolist()
        new_tokens: list[int] = []

        def generate() -> None:
            out = client.poll_request(job, client.generate(job, rows, params))["results"]
            new_tokens.append(sum(len(r["token_ids"]) for r in out))

        def weight_sync() -> None:
            request = client.weight_sync(
                job, f"{job}:training:0", [f"{job}:sampling:0"], weight_format="hf"
            )
            client.poll_request(job, request)

        report = {
            "placement": placed,
            "sft_s": timed(sft_step, args.warmup, args.repeats),
            "generate_s": timed(generate, args.warmup, args.repeats),
            "weight_sync_s": timed(weight_sync, 1, args.sync_repeats),
        }
        if set(new_tokens) != {args.prompts * args.new_tokens}:
            raise RuntimeError(f"the server generated {new_tokens} tokens per request")
        client.cancel_job(job)
        client.close()
    return report


def in_process(args, path: Path, ids, mask, prompts) -> dict:
    device = torch.device(args.device)
    model = load_causal_lm(str(path), args.dtype).to(device)
    n_parameters = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    prompt_ids = prompts.to(device)
    attention = torch.ones_like(prompt_ids)
    pad = model.generation_config.pad_token_id

    def generate() -> None:
        with torch.no_grad():
            out = model.generate(
                input_ids=prompt_ids,
                attention_mask=attention,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        sync()
        if out.shape[1] - prompt_ids.shape[1] != args.new_tokens:
            raise RuntimeError(f"model.generate returned {out.shape[1]} columns")

    generate_s = timed(generate, args.warmup, args.repeats)

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    ids_d, mask_d = ids.to(device), mask.to(device)

    def sft_step() -> None:
        # What the worker does for one forward_backward + step, results back on the CPU.
        logits = model(input_ids=ids_d, use_cache=False).logits
        logprobs, _ = token_logprobs_and_entropy(
            logits, torch.roll(ids_d, -1, -1), with_entropy=False
        )
        del logits
        loss, _ = causal_cross_entropy(logprobs, {"loss_mask": mask_d}, {})
        loss.backward()
        float(loss.detach())
        logprobs.detach().float().cpu()
        float(torch.nn.utils.clip_grad_norm_(params, float("inf")))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()

    sft_s = timed(sft_step, args.warmup, args.repeats)
    return {
        "n_parameters": n_parameters,
        "weight_bytes": weight_bytes,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "sft_s": sft_s,
        "generate_s": generate_s,
    }


def throughput(tokens: int, seconds: float, flops_per_token: float, peak: float | None) -> dict:
    per_s = tokens / seconds
    return {
        "tokens_per_s": per_s,
        "mfu": flops_per_token * per_s / (peak * 1e12) if peak else None,
    }


def compared(
    key: str,
    server_s: list[float],
    local_s: list[float],
    ratio: Callable[[float, float], float],
    target: tuple[str, float],
    tokens: int,
    flops_per_token: float,
    peak: float | None,
) -> dict:
    """The server's and the in-process run's times (``key``: their medians): ``ratio`` of the
    medians (server's, in-process's), the ``target`` it is held to, each side's throughput of
    ``tokens`` a run and every time."""
    on_server, in_process = statistics.median(server_s), statistics.median(local_s)
    return {
        key: {"server": on_server, "in_process": in_process},
        "ratio": ratio(on_server, in_process),
        target[0]: target[1],
        "server": throughput(tokens, on_server, flops_per_token, peak),
        "in_process": throughput(tokens, in_process, flops_per_token, peak),
        "all_s": {"server": server_s, "in_process": local_s},
    }


def report(args, path: Path, server: dict, local: dict) -> dict:
    n = local["n_parameters"]
    sync_s = statistics.median(server["weight_sync_s"])
    train_tokens = args.rows * args.length
    new_tokens = args.prompts * args.new_tokens
    return {
        "device": args.device,
        "gpu": local["gpu"],
        "model": args.model,
        "model_path": str(path),
        "dtype": args.dtype,
        "n_parameters": n,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": args.threads,
        "placement": server["placement"],
        "timing": {"statistic": "median", "warmup": args.warmup, "repeats": args.repeats},
        "peak_tflops": args.peak_tflops,
        "sft": {
            "batch": [args.rows, args.length],
            **compared(
                "step_s",
                server["sft_s"],
                local["sft_s"],
                lambda on_server, in_process: on_server / in_process,
                ("target_ratio_max", SFT_RATIO_MAX),
                train_tokens,
                6 * n,
                args.peak_tflops,
            ),
        },
        "sampling": {
            "prompts": args.prompts,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            **compared(
                "generate_s",
                server["generate_s"],
                local["generate_s"],
                # tokens/s through the server over tokens/s in-process (same token count).
                lambda on_server, in_process: in_process / on_server,
                ("target_ratio_min", SAMPLING_RATIO_MIN),
                new_tokens,
                2 * n,
                args.peak_tflops,
            ),
        },
        "weight_sync": {
            "format": "hf",
            "s": sync_s,
            "bytes": local["weight_bytes"],
            "gb_per_s": local["weight_bytes"] / sync_s / 1e9,
            "all_s": server["weight_sync_s"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    path = model_path(args)
    ids, mask = sft_batch(args.rows, args.length)
    prompts = prompt_batch(args.prompts, args.prompt_tokens)
    # The server's workers run first and are gone before this process touches the device.
    server = through_server(args, path, ids, mask, prompts)
    local = in_process(args, path, ids, mask, prompts)
    result = report(args, path, server, local)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
