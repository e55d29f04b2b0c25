"""A sub-job's worker process: one model on one device; commands in arrival order, and for a
sampling sub-job, continuous batching between them (:class:`_Loop`).

Started by the server as ``python -m cortex_recipes.local.worker --fd N --spec FILE``, or
ahead of time without ``--spec`` as a spare that imports what model loading needs and then
waits for one ``assign`` message naming its sub-job (:class:`~cortex_recipes.local.workers.
SparePool`); talks over the inherited socket with :mod:`cortex_recipes.local.protocol`. A command that fails
returns an error message and leaves the worker ready for the next one. Every reply carries the
command's ``seq``, so the server may send the next command before the last one is answered.

Invariants:
- The model lives on the spec's device (a GPU worker sees only its own GPU, as ``cuda:0``).
  Frame tensors are moved there once on receipt; results go back to the CPU before they are
  encoded, so the wire never carries device tensors.
- Requests arrive validated by the server (:mod:`cortex_recipes.local.validation`): the header
  carries the normalised processing block or sampling rows, and the worker trusts them.
- Before a model is moved to a GPU the worker checks that it fits; a sub-job that does not fit
  fails to start with a message naming the sub-job, the model and the memory it needs.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from cortex_training import wire

from cortex_recipes.local import checkpoints, processors
from cortex_recipes.local.batcher import Batcher, Limits, Pending, StepFailed
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.protocol import ConnectionClosed, recv_message, send_message
from cortex_recipes.local.sampling import _Row
from cortex_recipes.local.specs import WorkerSpec
from cortex_recipes.local.validation import GenerateRow, Processing, frame_temperature

log = logging.getLogger("cortex_recipes.local.worker")

# Model types whose causal-LM logits are exactly ``lm_head(model(x).last_hidden_state)`` (no
# scaling or soft-capping): forward_backward may project only the positions that carry loss.
PLAIN_LM_HEAD = frozenset({"llama", "mistral", "qwen2", "qwen3"})
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GIB = 1024**3
# AdamW keeps two fp32 moments per trainable parameter, plus its gradient.
TRAINING_BYTES_PER_TRAINABLE = 4 + 4 + 4
# Headroom for activations and the allocator, as a fraction of the weights (checked, not exact).
ACTIVATION_HEADROOM = 0.2


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it moved to ``device`` (once, on receipt)."""
    if torch.is_tensor(value):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return value


def to_host(value: Any) -> Any:
    """``value`` with every tensor in it on the CPU, ready for ``wire.dumps``."""
    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_host(v) for v in value)
    return value


def memory_needed(model, training: bool) -> int:
    """Bytes a sub-job needs on its device: weights, plus gradients and AdamW state for
    training, plus headroom for activations."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if training else 0
    return int(weights * (1 + ACTIVATION_HEADROOM) + trainable * TRAINING_BYTES_PER_TRAINABLE)


class Worker:
    """State and commands of one sub-job."""

    def __init__(self, spec: WorkerSpec):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from cortex_recipes.models import resolve_model_path

        self.spec = spec
        self.job_id = spec.job_id
        self.job_type = spec.job_type
        # A GPU worker is started with only its GPU visible, so it is always cuda:0 here.
        self.device = torch.device("cpu" if spec.device == "cpu" else "cuda:0")
        torch.manual_seed(spec.seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed(spec.seed)
        self.generator = torch.Generator(device=self.device).manual_seed(spec.seed)
        path = resolve_model_path(spec.model_name)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[spec.dtype], local_files_only=True
        )
        source = Path(spec.source_checkpoint_dir) if spec.source_checkpoint_dir else None
        if source and self.job_type != "training":
            model = self._apply_checkpoint_for_inference(model, source)
        if spec.lora and not hasattr(model, "peft_config"):
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model, LoraConfig(task_type="CAUSAL_LM", bias="none", **spec.lora)
            )
        if self.job_type != "training":
            for p in model.parameters():
                p.requires_grad_(False)
        self.model = self._place(model)
        self.eos_ids = self._eos_ids()
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else min(self.eos_ids, default=0)
        )
        self.global_steps = 0
        # The weight version a sampler holds (0: as loaded); set by each weight import.
        self.weight_version = 0
        self.optimizer = None
        if self.job_type == "training":
            self.model.train()
            opt = spec.optimizer or {}
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(
                params,
                lr=opt["lr"],
                betas=tuple(opt["betas"]),
                eps=opt["eps"],
                weight_decay=opt["weight_decay"],
            )
            if source:
                self._load_checkpoint(source, spec.load_optimizer_states)
        else:
            self.model.eval()

    # -- set-up helpers ---------------------------------------------------------------------

    def _place(self, model):
        if self.device.type == "cpu":
            return model
        needed = memory_needed(model, self.job_type == "training")
        free, total = torch.cuda.mem_get_info(self.device)
        if needed > free:
            raise BackendError(
                f"sub-job {self.spec.sub_job_id} (model {self.spec.model_name}, "
                f"{self.spec.dtype}) needs about {needed / GIB:.1f} GiB on {self.spec.device}, "
                f"which has {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB"
            )
        try:
            return model.to(self.device)
        except torch.cuda.OutOfMemoryError as exc:
            raise BackendError(
                f"sub-job {self.spec.sub_job_id} (model {self.spec.model_name}) ran out of "
                f"memory on {self.spec.device} while loading (asked for about "
                f"{needed / GIB:.1f} GiB)"
            ) from exc

    def _eos_ids(self) -> set[int]:
        ids = set()
        config = checkpoints.base_model(self.model).config
        for value in (self.tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(v for v in value if isinstance(v, int))
        return ids

    def _apply_checkpoint_for_inference(self, model, directory: Path):
        meta = checkpoints.verify(directory)
        if meta.get("lora"):
            from peft import LoraConfig, get_peft_model

            peft_model = get_peft_model(
                model, LoraConfig(task_type="CAUSAL_LM", bias="none", **meta["lora"])
            )
            checkpoints.load_adapter(peft_model, checkpoints.adapter_file(directory))
            if self.spec.lora:
                return peft_model
            return peft_model.merge_and_unload()
        checkpoints.load_full_weights(model, directory / checkpoints.FULL_WEIGHTS)
        return model

    def info(self) -> dict[str, Any]:
        config = checkpoints.base_model(self.model).config
        return {
            "vocab_size": int(config.vocab_size),
            "n_parameters": sum(p.numel() for p in self.model.parameters()),
            "n_trainable": sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            "lora": bool(self.spec.lora),
            "device": self.spec.device,
            "dtype": self.spec.dtype,
            "pid": os.getpid(),
        }

    # -- training -----------------------------------------------------------------------------

    @staticmethod
    def _model_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
        return {
            k: v for k, v in kwargs.items() if k in ("input_ids", "attention_mask", "position_ids")
        }

    def _logits(self, kwargs: dict[str, Any]) -> torch.Tensor:
        return self.model(**self._model_inputs(kwargs), use_cache=False).logits

    def _split_logits(
        self, kwargs: dict[str, Any], first: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(head, tail)`` logits of positions ``[0, first)`` (computed without a graph) and
        ``[first, T)`` (with one), for a model whose logits are ``lm_head(body(x))``; None
        when that does not hold or there is nothing to split. The positions before ``first``
        carry no loss, so only the tail's output projection and log-softmax are back-propagated
        (for a GRPO batch most positions are the prompt), and the head's values stay exact."""
        if first <= 0:
            return None
        base = self.model.get_base_model() if hasattr(self.model, "peft_config") else self.model
        if getattr(base.config, "model_type", None) not in PLAIN_LM_HEAD:
            return None
        hidden = base.model(**self._model_inputs(kwargs), use_cache=False).last_hidden_state
        with torch.no_grad():
            head = base.lm_head(hidden[:, :first].detach())
        return head, base.lm_head(hidden[:, first:])

    def forward_backward(self, header: dict[str, Any], frame: dict[str, Any]) -> dict[str, Any]:
        processing = Processing.from_json(header["processing"])
        kwargs = frame["kwargs"]
        context = frame.get("context") or {}
        self.model.train()
        if processing.loss_fn is None:
            # Legacy path: the model's own loss from kwargs.labels.
            model_kwargs = {
                k: v
                for k, v in kwargs.items()
                if k in ("input_ids", "attention_mask", "position_ids", "labels")
            }
            outputs = self.model(**model_kwargs, use_cache=False)
            loss, metrics, post = outputs.loss, {}, {}
        else:
            targets = processors.shifted_labels(kwargs["input_ids"], context.get("labels"))
            logprobs, entropy = self._token_logprobs(kwargs, context, targets, processing, frame)
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
        return {
            "job_id": self.job_id,
            "avg_loss": float(loss.detach()),
            "metrics": metrics,
            "post_process_outputs": post,
        }

    def _token_logprobs(self, kwargs, context, targets, processing, frame):
        """Per-token logprobs (and entropy for grpo) of a forward_backward batch."""
        with_entropy = processing.loss_fn == "grpo"
        temperature = frame_temperature(frame)
        mask = context.get("loss_mask")
        carried = torch.nonzero(mask.ne(0).any(0)).flatten() if torch.is_tensor(mask) else None
        first = int(carried[0]) if carried is not None and carried.numel() else 0
        split = self._split_logits(kwargs, first)
        if split is None:
            return processors.token_logprobs_and_entropy(
                self._logits(kwargs), targets, with_entropy=with_entropy, temperature=temperature
            )
        parts = []
        for logits, cols in ((split[0], slice(0, first)), (split[1], slice(first, None))):
            t = (
                temperature[:, cols]
                if torch.is_tensor(temperature)
                and temperature.dim() == 2
                and temperature.shape[1] == targets.shape[1]
                else temperature
            )
            parts.append(
                processors.token_logprobs_and_entropy(
                    logits, targets[:, cols], with_entropy=with_entropy, temperature=t
                )
            )
        logprobs = torch.cat([parts[0][0], parts[1][0]], dim=1)
        entropy = torch.cat([parts[0][1], parts[1][1]], dim=1) if with_entropy else None
        return logprobs, entropy

    def step(self, header: dict[str, Any], _: Any = None) -> dict[str, Any]:
        if self.optimizer is None:
            raise BackendError("step needs a training sub-job")
        learning_rate = header.get("learning_rate")
        if learning_rate is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = None
        if params and any(p.grad is not None for p in params):
            max_norm = self.spec.gradient_clipping or float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_steps += 1
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        result = {
            "job_id": self.job_id,
            "global_steps": self.global_steps,
            "last_lr": lrs[0] if len(lrs) == 1 else lrs,
            "grad_norm": grad_norm,
        }
        if self.device.type == "cuda":
            result["peak_memory"] = {"gpu_peak": torch.cuda.max_memory_allocated(self.device)}
        return result

    def save(self, header: dict[str, Any], _: Any = None) -> dict[str, Any]:
        checkpoints.write_checkpoint(
            Path(header["directory"]),
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer if header["checkpoint_type"] == "resumable" else None,
            device=self.device,
            meta={
                "checkpoint_id": header["checkpoint_id"],
                "checkpoint_type": header["checkpoint_type"],
                "global_steps": self.global_steps,
                "model_name": self.spec.model_name,
                "lora": self.spec.lora,
                "dtype": self.spec.dtype,
                "created_at": time.time(),
            },
        )
        return {"job_id": self.job_id, "global_steps": self.global_steps}

    def _load_checkpoint(self, directory: Path, load_optimizer: bool) -> None:
        meta = checkpoints.verify(directory)  # every file, before anything is loaded
        if bool(meta.get("lora")) != bool(self.spec.lora):
            raise BackendError(
                f"checkpoint {meta.get('checkpoint_id')} was saved with lora={meta.get('lora')}, "
                f"this sub-job has lora={self.spec.lora}"
            )
        if meta.get("lora"):
            checkpoints.load_adapter(self.model, checkpoints.adapter_file(directory))
        else:
            checkpoints.load_full_weights(self.model, directory / checkpoints.FULL_WEIGHTS)
        self.global_steps = int(meta.get("global_steps", 0))
        self.optimizer.zero_grad(set_to_none=True)
        if load_optimizer and meta.get("checkpoint_type") == "resumable":
            # verify() refused a resumable checkpoint without these two files
            checkpoints.load_optimizer(self.optimizer, directory / checkpoints.OPTIMIZER_STATE)
            rng = wire.loads((directory / checkpoints.RNG_STATE).read_bytes())
            checkpoints.restore_rng(rng, self.device)

    def load(self, header: dict[str, Any], _: Any = None) -> dict[str, Any]:
        self._load_checkpoint(Path(header["directory"]), self.spec.load_optimizer_states)
        return {"job_id": self.job_id, "global_steps": self.global_steps}

    def export_weights(self, header: dict[str, Any], _: Any = None) -> dict[str, Any]:
        target = Path(header["path"])
        tmp = target.with_suffix(".tmp")
        if header["weight_format"] == "lora":
            checkpoints.save_adapter(self.model, tmp)
        else:
            checkpoints.save_full_weights(self.model, tmp)
        tmp.replace(target)
        return {"bytes": target.stat().st_size, "global_steps": self.global_steps}

    def import_weights(self, header: dict[str, Any], _: Any = None) -> dict[str, Any]:
        if header["weight_format"] == "lora":
            checkpoints.load_adapter(self.model, Path(header["path"]))
        else:
            checkpoints.load_full_weights(self.model, Path(header["path"]))
        if header.get("weight_version") is not None:
            self.weight_version = int(header["weight_version"])
        return {"job_id": self.job_id, "weight_version": self.weight_version}

    # -- inference ------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, header: dict[str, Any], frame: dict[str, Any]) -> dict[str, Any]:
        kwargs = frame["kwargs"]
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self._logits(kwargs)
        finally:
            self.model.train(was_training)
        context = frame.get("context") or {}
        targets = processors.shifted_labels(kwargs["input_ids"], context.get("labels"))
        logprobs, _ = processors.token_logprobs_and_entropy(
            logits, targets, with_entropy=False, temperature=frame_temperature(frame)
        )
        # forward exists to score tokens, so logprobs come back with or without post processors.
        return {"job_id": self.job_id, "post_process_outputs": {"logprobs": logprobs.float()}}

    def generate_request(self, header: dict[str, Any]) -> Pending:
        """A generate command's rows, ready for the batcher (it samples them)."""
        rows: list[_Row] = []
        for i, raw in enumerate(header["rows"]):
            row = GenerateRow.from_json(raw)
            params = row.params
            if isinstance(row.prompt, str):
                prompt_ids = self.tokenizer.encode(row.prompt, add_special_tokens=True)
                # Only the worker's tokenizer can see a text prompt's length.
                if len(prompt_ids) >= self.spec.max_seq_len:
                    raise BackendError(
                        f"prompts[{i}] has {len(prompt_ids)} tokens; must be shorter than "
                        f"max_seq_len {self.spec.max_seq_len}"
                    )
                budget = self.spec.max_seq_len - len(prompt_ids)
                if params.max_tokens > budget:
                    params = replace(params, max_tokens=budget)
            else:
                prompt_ids = list(row.prompt)
            generator = (
                torch.Generator(device=self.device).manual_seed(params.seed)
                if params.seed is not None
                else self.generator
            )
            rows.append(_Row(self.tokenizer, prompt_ids, params, self.eos_ids, generator))
        return Pending(key=header.get("seq"), rows=rows, header=header)

    def generate_result(self, request: Pending) -> dict[str, Any]:
        return {"job_id": self.job_id, "results": [row.result() for row in request.rows]}

    def operations(self) -> dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]]:
        """The worker's operation table: op name -> handler(header, frame)."""
        return {
            "forward_backward": self.forward_backward,
            "forward": self.forward,
            "step": self.step,
            "save": self.save,
            "load": self.load,
            "export_weights": self.export_weights,
            "import_weights": self.import_weights,
        }


# Ops whose body is a DSSST1 model frame (decoded and moved to the device on receipt).
FRAME_OPS = ("forward_backward", "forward")


class _Inbox:
    """Commands read off the socket by a reader thread, so the main thread can take them
    between decode steps. ``cancel`` commands are not queued: they mark their target at once
    (the main thread drops it when it reaches it, or from the running batch). ``pause`` and
    ``resume`` are not queued either: a pause holds decoding from the next step boundary until
    a ``resume`` or its ``max_s`` runs out, whichever comes first; commands still run."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._queue: queue.Queue = queue.Queue()
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self.threads: int | None = None  # the torch threads the server last asked for
        self._paused_until: float | None = None  # time.monotonic() a pause runs out
        threading.Thread(target=self._read, name="inbox", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                header, body = recv_message(self._sock)
            except (ConnectionClosed, OSError):
                self._queue.put(None)
                return
            if header.get("op") == "cancel":
                with self._lock:
                    self._cancelled.add(int(header["target"]))
                self._queue.put(("wake", None))
            elif header.get("op") == "threads":
                self.threads = int(header["n"])  # applied by the main thread
                self._queue.put(("wake", None))
            elif header.get("op") == "pause":
                with self._lock:
                    self._paused_until = time.monotonic() + float(header["max_s"])
                self._queue.put(("wake", None))
            elif header.get("op") == "resume":
                with self._lock:
                    self._paused_until = None
                self._queue.put(("wake", None))
            else:
                self._queue.put((header, body))

    def pause_left(self) -> float | None:
        """Seconds the pause in force still holds decoding; None when there is none (a pause
        that ran out is logged once and lifted)."""
        with self._lock:
            if self._paused_until is None:
                return None
            left = self._paused_until - time.monotonic()
            if left <= 0:
                self._paused_until = None
                log.warning("generation pause ran out without a resume; decoding again")
                return None
            return left

    def take(self, block: bool, timeout: float | None = None) -> list:
        """Every command waiting (at least one when ``block``, unless ``timeout`` seconds pass
        first); None marks a closed socket."""
        items = []
        try:
            items.append(self._queue.get(block=block, timeout=timeout if block else None))
            while True:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return [i for i in items if i is None or i[0] != "wake"]

    def cancelled(self) -> set[int]:
        with self._lock:
            return set(self._cancelled)

    def forget(self, seqs: set[int]) -> None:
        with self._lock:
            self._cancelled -= seqs


class _Loop:
    """The worker's main thread: commands in arrival order, generation between them.

    A training or log-probability worker runs one command at a time, as they arrive. A sampling
    worker adds generate commands to its :class:`~cortex_recipes.local.batcher.Batcher` and
    decodes one step at a time; every other command (a weight import, a forward) runs at the
    next step boundary, so none waits behind a generation. A reply carries the command's
    ``seq``; a cancelled command is answered ``cancelled`` instead of run.
    """

    def __init__(self, sock: socket.socket, worker: Worker):
        self.sock = sock
        self.worker = worker
        self.table = worker.operations()
        self.inbox = _Inbox(sock)
        self.batcher = (
            Batcher(
                worker.model,
                worker.pad_id,
                Limits(
                    max_rows=worker.spec.max_num_seqs,
                    max_tokens=worker.spec.max_num_batched_tokens,
                ),
            )
            if worker.job_type == "sampling"
            else None
        )
        self.last_seq = -1

    def reply(
        self, header: dict[str, Any], started: float | None, result=None, error=None, **extra
    ):
        message = {"id": header.get("id"), "seq": header.get("seq"), "started_at": started}
        if error is None:
            send_message(self.sock, {**message, "ok": True, **extra}, wire.dumps(to_host(result)))
        else:
            send_message(self.sock, {**message, "ok": False, "error": error, **extra})

    def run(self) -> None:
        while True:
            paused = self.inbox.pause_left()
            decoding = self.batcher is not None and self.batcher.busy and paused is None
            for item in self.inbox.take(block=not decoding, timeout=paused):
                if item is None:
                    return
                self.apply_threads()
                self.handle(*item)
            self.apply_threads()
            self.apply_cancels()
            if self.batcher is not None and self.batcher.busy and self.inbox.pause_left() is None:
                self.decode_step()

    def handle(self, header: dict[str, Any], body: bytes) -> None:
        seq = header.get("seq")
        if isinstance(seq, int):
            self.last_seq = max(self.last_seq, seq)
            if seq in self.inbox.cancelled():
                self.inbox.forget({seq})
                self.reply(header, None, error="cancelled by request", cancelled=True)
                return
        started = time.time()
        op = header.get("op")
        try:
            if op == "generate" and self.batcher is not None:
                self.batcher.add(self.worker.generate_request(header))
                return
            handler = self.table.get(op)
            if handler is None:
                known = ", ".join([*self.table, *(["generate"] if self.batcher else [])])
                raise BackendError(f"unknown worker op {op!r}; known: {known}")
            frame = to_device(wire.loads(body), self.worker.device) if op in FRAME_OPS else None
            result = handler(header, frame)
        except Exception as exc:
            self.reply(header, started, error=describe_failure(exc, op, self.worker.spec))
            return
        self.reply(header, started, result=result)

    def apply_threads(self) -> None:
        """Use the thread count the server last asked for (:mod:`cortex_recipes.local.cores`);
        set from this thread, which runs every op."""
        wanted = self.inbox.threads
        if wanted is not None and wanted != torch.get_num_threads():
            torch.set_num_threads(wanted)

    def apply_cancels(self) -> None:
        """Drop the cancelled requests that have arrived (later ones stay marked)."""
        due = {seq for seq in self.inbox.cancelled() if seq <= self.last_seq}
        if not due:
            return
        self.inbox.forget(due)
        for seq in due:
            request = self.batcher.cancel(seq) if self.batcher is not None else None
            if request is not None:
                self.reply(
                    request.header, request.started_at, error="cancelled by request", cancelled=True
                )

    def decode_step(self) -> None:
        try:
            finished = self.batcher.step(self.worker.weight_version)
        except StepFailed as failed:
            message = describe_failure(failed.cause, "generate", self.worker.spec)
            for request in failed.requests:
                self.reply(request.header, request.started_at or time.time(), error=message)
            return
        for request in finished:
            self.reply(
                request.header, request.started_at, result=self.worker.generate_result(request)
            )


def describe_failure(exc: BaseException, op: Any, spec: WorkerSpec) -> str:
    """The error message a failed command replies with (unanticipated ones are logged)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return (
            f"{op} ran out of GPU memory on {spec.device} (sub-job {spec.sub_job_id}, "
            f"model {spec.model_name}); send a smaller batch"
        )
    if isinstance(exc, BackendError):
        return str(exc)
    log.error("op %s failed:\n%s", op, "".join(traceback.format_exception(exc)))
    return f"{type(exc).__name__}: {exc}"


def serve(sock: socket.socket, spec: WorkerSpec) -> None:
    started = time.monotonic()
    try:
        worker = Worker(spec)
    except Exception as exc:  # report why the sub-job could not start, then exit
        log.exception("sub-job %s failed to start", spec.sub_job_id)
        message = str(exc) if isinstance(exc, BackendError) else f"{type(exc).__name__}: {exc}"
        send_message(sock, {"ready": False, "error": message})
        return
    info = {**worker.info(), "load_s": round(time.monotonic() - started, 3)}
    send_message(sock, {"ready": True, "info": info})
    _Loop(sock, worker).run()


# Imported by a pre-started (spare) worker while it waits for its sub-job: what loading a model
# of the common architectures and wrapping it with LoRA would otherwise import at start-up.
WARM_MODULES = (
    "transformers.modeling_utils",
    "transformers.generation.utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen3.modeling_qwen3",
    "peft",
)


def warm_imports() -> None:
    """Import :data:`WARM_MODULES` (one missing from this transformers is skipped: the import
    then happens when a model of it loads, as without a spare)."""
    import importlib

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"spare worker: {name} not imported ({exc})", file=sys.stderr, flush=True)


def wait_for_assignment(sock: socket.socket) -> tuple[WorkerSpec, Path] | None:
    """A spare's one message: the sub-job's spec file and log file (None: the server closed the
    connection, or stopped the spare). From then on the process's stdout and stderr go to that
    sub-job's log, as a worker started for it would."""
    try:
        header, _ = recv_message(sock)
    except (ConnectionClosed, OSError):
        return None
    if header.get("op") != "assign":
        return None
    log_path = Path(header["log"])
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return WorkerSpec.from_json(Path(header["spec"]).read_text()), log_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--spec", help="the sub-job's spec file (without it: a spare worker)")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    if args.spec:
        spec = WorkerSpec.from_json(Path(args.spec).read_text())
    else:
        warm_imports()
        assigned = wait_for_assignment(sock)
        if assigned is None:
            return 0
        spec, _ = assigned
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {spec.sub_job_id} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    torch.set_num_threads(spec.threads)
    serve(sock, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
