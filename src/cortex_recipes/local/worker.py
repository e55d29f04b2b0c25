"""A sub-job's worker process: one model, one command at a time, results as DSSST1 frames.

Started by the server as ``python -m cortex_recipes.local.worker --fd N --spec FILE``; talks
over the inherited socket with :mod:`cortex_recipes.local.protocol`. A command that fails
returns an error message and leaves the worker ready for the next one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from cortex_training import wire

from cortex_recipes.local import checkpoints, processors
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.protocol import ConnectionClosed, recv_message, send_message
from cortex_recipes.local.sampling import (
    SamplingParams,
    generate_batch,
    generate_one,
    parse_sampling_params,
)

log = logging.getLogger("cortex_recipes.local.worker")


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


class Worker:
    """State and commands of one sub-job."""

    def __init__(self, spec: dict[str, Any]):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from cortex_recipes.models import resolve_model_path

        self.spec = spec
        self.job_id = spec["job_id"]
        self.job_type = spec["job_type"]
        torch.manual_seed(spec["seed"])
        self.generator = torch.Generator().manual_seed(spec["seed"])
        path = resolve_model_path(spec["model_name"])
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=_dtype(spec["dtype"]), local_files_only=True
        )
        source = spec.get("source_checkpoint_dir")
        if source and self.job_type != "training":
            model = self._apply_checkpoint_for_inference(model, Path(source))
        lora = spec.get("lora")
        if lora and not hasattr(model, "peft_config"):
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(task_type="CAUSAL_LM", bias="none", **lora),
            )
        self.model = model
        self.eos_ids = self._eos_ids()
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else min(self.eos_ids, default=0)
        )
        self.global_steps = 0
        self.optimizer = None
        self.pending_backward = 0
        if self.job_type == "training":
            self.model.train()
            opt = spec["optimizer"]
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(
                params,
                lr=opt["lr"],
                betas=tuple(opt["betas"]),
                eps=opt["eps"],
                weight_decay=opt["weight_decay"],
            )
            if source:
                self._load_checkpoint(Path(source), spec.get("load_optimizer_states", True))
        else:
            self.model.eval()
            for p in self.model.parameters():
                p.requires_grad_(False)

    # -- set-up helpers ---------------------------------------------------------------------

    def _eos_ids(self) -> set[int]:
        ids = set()
        for value in (self.tokenizer.eos_token_id, getattr(self._config(), "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(v for v in value if isinstance(v, int))
        return ids

    def _config(self):
        return checkpoints.base_model(self.model).config if hasattr(self, "model") else None

    def _apply_checkpoint_for_inference(self, model, directory: Path):
        meta = checkpoints.read_meta(directory)
        if meta.get("lora"):
            from peft import LoraConfig, get_peft_model

            peft_model = get_peft_model(
                model, LoraConfig(task_type="CAUSAL_LM", bias="none", **meta["lora"])
            )
            checkpoints.load_adapter(peft_model, directory / checkpoints.ADAPTER_WEIGHTS)
            if self.spec.get("lora"):
                return peft_model
            return peft_model.merge_and_unload()
        checkpoints.load_full_weights(model, directory / checkpoints.FULL_WEIGHTS)
        return model

    def info(self) -> dict[str, Any]:
        config = self._config()
        return {
            "vocab_size": int(config.vocab_size),
            "n_parameters": sum(p.numel() for p in self.model.parameters()),
            "n_trainable": sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            "lora": bool(self.spec.get("lora")),
        }

    # -- training -----------------------------------------------------------------------------

    def _logits(self, kwargs: dict[str, Any]) -> torch.Tensor:
        model_kwargs = {k: v for k, v in kwargs.items() if k != "labels"}
        return self.model(**model_kwargs, use_cache=False).logits

    def forward_backward(self, frame: dict[str, Any]) -> dict[str, Any]:
        kwargs = frame["kwargs"]
        processing = processors.parse_processing(frame.get("processing"), require_loss=False)
        context = processors.validate_context(processing, frame.get("context"), kwargs["input_ids"])
        self.model.train()
        if processing.loss_fn is None:
            # Legacy path: the model's own loss from kwargs.labels.
            if "labels" not in kwargs:
                raise BackendError("forward-backward without processing needs kwargs.labels")
            outputs = self.model(**kwargs, use_cache=False)
            loss, metrics, post = outputs.loss, {}, {}
        else:
            logits = self._logits(kwargs)
            targets = processors.shifted_labels(kwargs["input_ids"], context.get("labels"))
            want_entropy = processing.loss_fn == "grpo"
            logprobs, entropy = processors.token_logprobs_and_entropy(
                logits, targets, with_entropy=want_entropy
            )
            del logits
            if processing.loss_fn == "causal_cross_entropy":
                loss, metrics = processors.causal_cross_entropy(
                    logprobs, context, processing.config
                )
            else:
                loss, metrics = processors.grpo(logprobs, entropy, context, processing.config)
            post = {"logprobs": logprobs.detach().float()} if processing.post else {}
        if not torch.isfinite(loss):
            raise BackendError(f"loss is not finite ({float(loss)}); no gradient was applied")
        loss.backward()
        self.pending_backward += 1
        return {
            "job_id": self.job_id,
            "avg_loss": float(loss.detach()),
            "metrics": metrics,
            "post_process_outputs": post,
        }

    def step(self, learning_rate: float | None) -> dict[str, Any]:
        if self.optimizer is None:
            raise BackendError("step needs a training sub-job")
        if learning_rate is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = None
        clip = self.spec.get("gradient_clipping")
        if params and any(p.grad is not None for p in params):
            max_norm = clip if clip else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_steps += 1
        self.pending_backward = 0
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        return {
            "job_id": self.job_id,
            "global_steps": self.global_steps,
            "last_lr": lrs[0] if len(lrs) == 1 else lrs,
            "grad_norm": grad_norm,
        }

    def save(self, directory: str, checkpoint_type: str, checkpoint_id: str) -> dict[str, Any]:
        final = Path(directory)
        tmp = Path(tempfile.mkdtemp(prefix=".saving-", dir=final.parent.parent))
        try:
            lora = self.spec.get("lora")
            if lora:
                checkpoints.save_adapter(self.model, tmp / checkpoints.ADAPTER_WEIGHTS)
            else:
                checkpoints.save_full_weights(self.model, tmp / checkpoints.FULL_WEIGHTS)
            if checkpoint_type == "resumable":
                checkpoints.save_optimizer(self.optimizer, tmp / checkpoints.OPTIMIZER_STATE)
                rng = torch.get_rng_state()
                (tmp / "rng.dssst1").write_bytes(wire.dumps({"torch": rng}))
            checkpoints.write_meta(
                tmp,
                {
                    "checkpoint_id": checkpoint_id,
                    "checkpoint_type": checkpoint_type,
                    "global_steps": self.global_steps,
                    "model_name": self.spec["model_name"],
                    "lora": lora,
                    "created_at": time.time(),
                },
            )
            checkpoints.atomic_publish(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return {"job_id": self.job_id, "global_steps": self.global_steps}

    def _load_checkpoint(self, directory: Path, load_optimizer: bool) -> None:
        meta = checkpoints.read_meta(directory)
        if bool(meta.get("lora")) != bool(self.spec.get("lora")):
            raise BackendError(
                f"checkpoint {meta.get('checkpoint_id')} was saved with lora={meta.get('lora')}, "
                f"this sub-job has lora={self.spec.get('lora')}"
            )
        if meta.get("lora"):
            checkpoints.load_adapter(self.model, directory / checkpoints.ADAPTER_WEIGHTS)
        else:
            checkpoints.load_full_weights(self.model, directory / checkpoints.FULL_WEIGHTS)
        self.global_steps = int(meta.get("global_steps", 0))
        self.optimizer.zero_grad(set_to_none=True)
        opt_path = directory / checkpoints.OPTIMIZER_STATE
        if load_optimizer and meta.get("checkpoint_type") == "resumable" and opt_path.exists():
            checkpoints.load_optimizer(self.optimizer, opt_path)
            rng_path = directory / "rng.dssst1"
            if rng_path.exists():
                torch.set_rng_state(wire.loads(rng_path.read_bytes())["torch"])

    def load(self, directory: str) -> dict[str, Any]:
        self._load_checkpoint(Path(directory), self.spec.get("load_optimizer_states", True))
        return {"job_id": self.job_id, "global_steps": self.global_steps}

    def export_weights(self, path: str, weight_format: str) -> dict[str, Any]:
        target = Path(path)
        tmp = target.with_suffix(".tmp")
        if weight_format == "lora":
            if not self.spec.get("lora"):
                raise BackendError(
                    "weight_format='lora' needs a training sub-job with a peft_config"
                )
            checkpoints.save_adapter(self.model, tmp)
        else:
            checkpoints.save_full_weights(self.model, tmp)
        os.replace(tmp, target)
        return {"bytes": target.stat().st_size, "global_steps": self.global_steps}

    def import_weights(self, path: str, weight_format: str) -> dict[str, Any]:
        if weight_format == "lora":
            checkpoints.load_adapter(self.model, Path(path))
        else:
            checkpoints.load_full_weights(self.model, Path(path))
        return {"job_id": self.job_id}

    # -- inference ------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, frame: dict[str, Any]) -> dict[str, Any]:
        kwargs = frame["kwargs"]
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self._logits(kwargs)
        finally:
            self.model.train(was_training)
        context = frame.get("context") or {}
        targets = processors.shifted_labels(kwargs["input_ids"], context.get("labels"))
        logprobs, _ = processors.token_logprobs_and_entropy(logits, targets, with_entropy=False)
        # forward exists to score tokens, so logprobs come back with or without post processors.
        return {"job_id": self.job_id, "post_process_outputs": {"logprobs": logprobs.float()}}

    def generate(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Rows that share sampling parameters (all but the seed) are sampled as one batch."""
        prompts = frame["prompts"]
        raw_params = frame.get("sampling_params")
        rows: list[tuple[list[int], SamplingParams, torch.Generator]] = []
        for i, prompt in enumerate(prompts):
            raw = raw_params[i] if isinstance(raw_params, list) else raw_params
            params = parse_sampling_params(
                raw, f"sampling_params[{i}]" if isinstance(raw_params, list) else "sampling_params"
            )
            if isinstance(prompt, str):
                prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=True)
            else:
                prompt_ids = [int(t) for t in prompt]
            if len(prompt_ids) >= self.spec["max_seq_len"]:
                raise BackendError(
                    f"prompt {i} has {len(prompt_ids)} tokens; max_seq_len is {self.spec['max_seq_len']}"
                )
            budget = self.spec["max_seq_len"] - len(prompt_ids)
            if params.max_tokens > budget:
                params = replace(params, max_tokens=budget)
            generator = (
                torch.Generator().manual_seed(params.seed)
                if params.seed is not None
                else self.generator
            )
            rows.append((prompt_ids, params, generator))
        batches: dict[SamplingParams, list[int]] = {}
        for i, (_, params, _) in enumerate(rows):
            batches.setdefault(replace(params, seed=None), []).append(i)
        results: list[dict[str, Any] | None] = [None] * len(rows)
        for params, members in batches.items():
            if len(members) == 1:
                prompt_ids, own, generator = rows[members[0]]
                results[members[0]] = generate_one(
                    self.model, self.tokenizer, prompt_ids, own, self.eos_ids, generator
                )
                continue
            outs = generate_batch(
                self.model,
                self.tokenizer,
                [rows[i][0] for i in members],
                params,
                self.eos_ids,
                [rows[i][2] for i in members],
                self.pad_id,
            )
            for i, out in zip(members, outs, strict=True):
                results[i] = out
        return {"job_id": self.job_id, "results": results}


def _dispatch(worker: Worker, header: dict[str, Any], body: bytes) -> dict[str, Any]:
    op = header["op"]
    if op in ("forward_backward", "forward", "generate"):
        frame = wire.loads(body)
        return getattr(worker, op)(frame)
    if op == "step":
        return worker.step(header.get("learning_rate"))
    if op == "save":
        return worker.save(header["directory"], header["checkpoint_type"], header["checkpoint_id"])
    if op == "load":
        return worker.load(header["directory"])
    if op == "export_weights":
        return worker.export_weights(header["path"], header["weight_format"])
    if op == "import_weights":
        return worker.import_weights(header["path"], header["weight_format"])
    raise BackendError(f"unknown worker op {op!r}")


def serve(sock: socket.socket, spec: dict[str, Any]) -> None:
    try:
        worker = Worker(spec)
    except Exception as exc:  # report why the sub-job could not start, then exit
        log.exception("sub-job %s failed to start", spec.get("sub_job_id"))
        send_message(sock, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    send_message(sock, {"ready": True, "info": worker.info()})
    while True:
        try:
            header, body = recv_message(sock)
        except ConnectionClosed:
            return
        started = time.time()
        try:
            result = _dispatch(worker, header, body)
            send_message(
                sock,
                {"id": header.get("id"), "ok": True, "started_at": started},
                wire.dumps(result),
            )
        except Exception as exc:
            if not isinstance(exc, BackendError):
                log.error("op %s failed:\n%s", header.get("op"), traceback.format_exc())
            send_message(
                sock,
                {
                    "id": header.get("id"),
                    "ok": False,
                    "error": str(exc)
                    if isinstance(exc, BackendError)
                    else f"{type(exc).__name__}: {exc}",
                    "started_at": started,
                },
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {spec['sub_job_id']} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    torch.set_num_threads(int(spec.get("threads") or 1))
    sock = socket.socket(fileno=args.fd)
    serve(sock, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
