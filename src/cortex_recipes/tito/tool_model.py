"""A model whose tokenizer carries the special tokens a token-exact renderer needs.

The ``renderers`` Qwen3 renderer builds every tool turn from single special tokens
(``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``, ``<think>``,
``</think>``, plus ChatML's ``<|im_start|>``, ``<|im_end|>`` and ``<|endoftext|>``) and refuses
a tokenizer without them. SmolLM2 speaks ChatML but has no tool tokens, so a TITO profile with
``add_renderer_tokens: true`` runs on a derived copy of its model:

- the missing tokens are appended to the tokenizer as special tokens, in a fixed order;
- the embedding matrix grows by as many rows (SmolLM2 ties its output head to it), each new row
  the mean of the embeddings of the token's text as the original tokenizer splits it, so a new
  token starts close to the text it replaces;
- nothing else changes: a prompt without the new tokens tokenizes and scores exactly as before.

The copy is built once, deterministically, under the model cache (``CORTEX_RECIPES_CACHE``), keyed
by the source directory's weights digest and the token list; the SFT warm start and the
LoRA adapters then learn to emit the new tokens. This is a local-backend step: a hosted endpoint
serves only the models it has, so a hosted profile names a model that already carries the tokens.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from cortex_recipes.models import resolve_model_path
from cortex_recipes.models.cache import build_once, cache_root

# What the renderers Qwen3 renderer looks up with convert_tokens_to_ids (renderers/qwen3.py).
QWEN3_RENDERER_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
BUILD_REVISION = "t1"


class ToolModelError(ValueError):
    """A model that cannot be given the renderer's tokens."""


def missing_tokens(tokenizer, tokens=QWEN3_RENDERER_TOKENS) -> list[str]:
    """The tokens of ``tokens`` that ``tokenizer`` has no single id for."""
    vocab = tokenizer.get_vocab()
    return [t for t in tokens if t not in vocab]


def _weights_digest(source: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(p.name for p in source.glob("*.safetensors")):
        with open(source / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def with_renderer_tokens(model: str, tokens=QWEN3_RENDERER_TOKENS) -> Path:
    """The directory of ``model`` with ``tokens`` added (``model``'s own directory when it already
    has them all)."""
    from transformers import AutoTokenizer

    source = resolve_model_path(model)
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    missing = missing_tokens(tokenizer, tokens)
    if not missing and tokenizer.unk_token not in tokens:
        return source
    for required in ("<|im_start|>", "<|im_end|>"):
        if required in missing:
            raise ToolModelError(
                f"model={model!r}: its tokenizer has no {required!r}; adding tool tokens only "
                "suits ChatML models (whose turns the Qwen3 renderer writes)"
            )
    key = hashlib.sha256(
        json.dumps([BUILD_REVISION, _weights_digest(source), missing]).encode()
    ).hexdigest()[:16]
    target = cache_root() / "models" / "with-renderer-tokens" / f"{Path(model).name}-{key}"
    return build_once(target, lambda out: _build(source, missing, out))


def _build(source: Path, missing: list[str], out: Path) -> None:
    import torch
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=torch.float32, local_files_only=True
    )
    pieces = [tokenizer.encode(t, add_special_tokens=False) for t in missing]
    added = tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True
    )
    if added != len(missing):
        raise ToolModelError(f"added {added} of the tokens {missing}")
    embeddings = model.get_input_embeddings().weight
    old_rows = embeddings.shape[0]
    # A padded vocabulary (more rows than tokens) puts new ids on spare rows, overwritten below.
    model.resize_token_embeddings(max(len(tokenizer), old_rows), mean_resizing=False)
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        for token, ids in zip(missing, pieces, strict=True):
            weight[tokenizer.convert_tokens_to_ids(token)] = weight[ids].mean(dim=0)
        if not model.config.tie_word_embeddings and model.get_output_embeddings() is not None:
            head = model.get_output_embeddings().weight
            for token, ids in zip(missing, pieces, strict=True):
                head[tokenizer.convert_tokens_to_ids(token)] = head[ids].mean(dim=0)
    if tokenizer.unk_token in QWEN3_RENDERER_TOKENS:
        # SmolLM2 names <|endoftext|> its unknown token; a byte-level BPE never emits one, and
        # the renderer refuses a special token whose id is the unknown id.
        tokenizer.unk_token = None
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for extra in ("generation_config.json",):
        if (source / extra).is_file() and not (out / extra).is_file():
            shutil.copyfile(source / extra, out / extra)
