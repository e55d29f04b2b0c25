"""One sub-job's model on its device, and the commands it answers, one class per sub-job type.

- :class:`ModelWorker`: loads the model (and a source checkpoint), places it, and answers
  ``forward`` (token log-probabilities): a ``log_probability`` sub-job is exactly this, frozen;
- :class:`TrainingWorker`: ``forward_backward``, ``step``, ``save``, ``load`` and
  ``export_weights`` (for a weight sync), with its AdamW optimizer;
- :class:`SamplingWorker`: ``generate`` (its rows go to the continuous batcher) and
  ``import_weights`` (the receiving end of a weight sync), frozen.

:func:`make_worker` picks the class from the spec; the process around it (commands in arrival
order, the batcher between them) is :mod:`cortex_recipes.local.worker`.

Invariants:
- The model lives on the spec's device (a GPU worker sees only its own GPU, as ``cuda:0``);
  before a model is moved to a GPU the worker checks that it fits, and a sub-job that does not
  fit fails to start with a message naming the sub-job, the model and the memory it needs.
- Requests arrive validated by the server (:mod:`~cortex_recipes.local.frame_checks`,
  :mod:`~cortex_recipes.local.generate_params`): the header carries the normalised processing
  block or sampling rows, and the worker trusts them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from cortex_training import wire

from cortex_recipes.local import checkpoints, losses, processors
from cortex_recipes.local.batcher import Pending
from cortex_recipes.local.decoding import _Row
from cortex_recipes.local.errors import BackendError
from cortex_recipes.local.frame_checks import frame_temperature
from cortex_recipes.local.generate_params import GenerateRow
from cortex_recipes.local.loss_schemas import Processing
from cortex_recipes.local.specs import WorkerSpec

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


def place_logprobs(result: dict[str, Any], logprobs: torch.Tensor, where: str | None) -> dict:
    """``result`` with ``logprobs`` at ``post_process_outputs.logprobs`` (``where`` None: this
    backend's default), or, as hosted Cortex's assembler answers (hosted-conformance rule
    ``forward-logprobs-placement``), with ``post_process_outputs`` empty and the logprobs under
    ``batch.logprobs`` (``where`` "batch") or at the top level ("top")."""
    if where is None:
        return {**result, "post_process_outputs": {"logprobs": logprobs}}
    if where == "batch":
        return {**result, "post_process_outputs": {}, "batch": {"logprobs": logprobs}}
    return {**result, "post_process_outputs": {}, "logprobs": logprobs}


def memory_needed(model, training: bool) -> int:
    """Bytes a sub-job needs on its device: weights, plus gradients and AdamW state for
    training, plus headroom for activations."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if training else 0
    return int(weights * (1 + ACTIVATION_HEADROOM) + trainable * TRAINING_BYTES_PER_TRAINABLE)


class ModelWorker:
    """A sub-job's model, frozen: ``forward`` scores tokens (a ``log_probability`` sub-job)."""

    TRAINS = False

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
        self.model = self._place(self._prepare(model, source))
        self.eos_ids = self._eos_ids()
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else min(self.eos_ids, default=0)
        )
        self.global_steps = 0
        self._start(source)

    def _with_lora(self, model):
        if self.spec.lora and not hasattr(model, "peft_config"):
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model, LoraConfig(task_type="CAUSAL_LM", bias="none", **self.spec.lora)
            )
        return model

    def _prepare(self, model, source: Path | None):
        """The model to place: the source checkpoint applied, LoRA wrapped, frozen."""
        if source:
            model = self._apply_checkpoint_for_inference(model, source)
        model = self._with_lora(model)
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def _start(self, source: Path | None) -> None:
        self.model.eval()

    # -- set-up helpers ---------------------------------------------------------------------

    def _place(self, model):
        if self.device.type == "cpu":
            return model
        needed = memory_needed(model, self.TRAINS)
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

    def operations(self) -> dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]]:
        """The worker's operation table: op name -> handler(header, frame)."""
        return {"forward": self.forward}

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
        return place_logprobs({"job_id": self.job_id}, logprobs.float(), header.get("logprobs_at"))


class TrainingWorker(ModelWorker):
    """A ``training`` sub-job: its trainable parameters, AdamW optimizer and step count."""

    TRAINS = True

    def _prepare(self, model, source: Path | None):
        return self._with_lora(model)  # a source checkpoint loads once the optimizer exists

    def _start(self, source: Path | None) -> None:
        self.model.train()
        opt = self.spec.optimizer or {}
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=opt["lr"],
            betas=tuple(opt["betas"]),
            eps=opt["eps"],
            weight_decay=opt["weight_decay"],
        )
        if source:
            self._load_checkpoint(source, self.spec.load_optimizer_states)

    def operations(self) -> dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]]:
        return {
            **super().operations(),
            "forward_backward": self.forward_backward,
            "step": self.step,
            "save": self.save,
            "load": self.load,
            "export_weights": self.export_weights,
        }

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
            loss, metrics = losses.rank_mean_loss(
                processing.loss_fn, logprobs, entropy, context, processing.config,
                ranks=int(header.get("ranks") or 1),
            )  # fmt: skip
            post = {"logprobs": logprobs.detach().float()} if processing.post else {}
        if not torch.isfinite(loss):
            raise BackendError(f"loss is not finite ({float(loss)}); no gradient was applied")
        loss.backward()
        result = {"job_id": self.job_id, "avg_loss": float(loss.detach()), "metrics": metrics}
        if post and header.get("logprobs_at"):
            return place_logprobs(result, post["logprobs"], header["logprobs_at"])
        return {**result, "post_process_outputs": post}

    def _token_logprobs(self, kwargs, context, targets, processing, frame):
        """Per-token logprobs (and entropy for grpo) of a forward_backward batch."""
        with_entropy = losses.get(processing.loss_fn).with_entropy
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


class SamplingWorker(ModelWorker):
    """A ``sampling`` sub-job: generate rows for the batcher, and weights a sync imports."""

    def _start(self, source: Path | None) -> None:
        super()._start(source)
        # The weight version this sampler holds (0: as loaded); set by each weight import.
        self.weight_version = 0

    def operations(self) -> dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]]:
        return {**super().operations(), "import_weights": self.import_weights}

    def import_weights(self, header: dict[str, Any], _: Any = None) -> dict[str, Any]:
        if header["weight_format"] == "lora":
            checkpoints.load_adapter(self.model, Path(header["path"]))
        else:
            checkpoints.load_full_weights(self.model, Path(header["path"]))
        if header.get("weight_version") is not None:
            self.weight_version = int(header["weight_version"])
        return {"job_id": self.job_id, "weight_version": self.weight_version}

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
        results = [row.result() for row in request.rows]
        if request.header.get("float_logprobs"):  # hosted-conformance rule sampler-logprob-floats
            for result in results:
                if "logprobs" in result:
                    result["logprobs"] = [
                        {token: entry["logprob"] for token, entry in position.items()}
                        for position in result["logprobs"]
                    ]
        return {"job_id": self.job_id, "results": results}


WORKERS: dict[str, type[ModelWorker]] = {
    "training": TrainingWorker,
    "sampling": SamplingWorker,
    "log_probability": ModelWorker,
}


def make_worker(spec: WorkerSpec) -> ModelWorker:
    """The worker of ``spec.job_type`` (the registry only makes these three)."""
    return WORKERS[spec.job_type](spec)
