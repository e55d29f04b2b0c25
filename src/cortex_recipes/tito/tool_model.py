"""A model whose tokenizer carries the special tokens a token-exact renderer needs.

The ``renderers`` Qwen3 renderer builds every tool turn from single special tokens
(``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``, ``<think>``,
``</think>``, plus ChatML's ``<|im_start|>``, ``<|im_end|>`` and ``<|endoftext|>``) and refuses
a tokenizer without them. SmolLM2 speaks ChatML but has no tool tokens, so a TITO profile with
``add_renderer_tokens: true`` runs on a derived copy of its model:

- **Names.** Special tokens that chat never uses (SmolLM2's code-corpus markers such as
  ``<issue_start>``) are renamed to the missing names, so the vocabulary keeps its size and
  text without a renamed token tokenizes exactly as before.
- **Embeddings.** SmolLM2's unused special tokens share one untrained embedding (cosine 1.00
  between them, measured), and LoRA does not train embeddings: with those rows a warm start
  emits ``<file_sep>`` where ``</tool_call>`` belongs. So each renamed token's row (the output
  head is tied to it) becomes, at the norm of an ordinary row, half the mean embedding of its
  name's text pieces (a prior the model can read) and half a seeded random direction (so no
  two are alike). Every other row is unchanged.
- **Unknown token.** SmolLM2 names ``<|endoftext|>`` its unknown token (a byte-level BPE never
  emits one); the renderer refuses a special token whose id is the unknown id, so the copy has
  no unknown token.

The copy is built once, deterministically, under the model cache (``CORTEX_RECIPES_CACHE``), keyed
by the source directory's files and the renaming. This is a local-backend step: a hosted
endpoint serves only the models it has, so a hosted profile names a model that already carries
the tokens.
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
# Special tokens of code corpora that a chat never uses, in the order they are taken.
DONORS = (
    "<issue_start>",
    "<issue_closed>",
    "<jupyter_output>",
    "<empty_output>",
    "<jupyter_start>",
    "<jupyter_script>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<issue_comment>",
    "<gh_stars>",
    "<filename>",
    "<file_sep>",
    "<reponame>",
    "<repo_name>",
)
BUILD_REVISION = "t3"
EMBEDDING_SEED = 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class ToolModelError(ValueError):
    """A model that cannot be given the renderer's tokens."""


def missing_tokens(tokenizer, tokens=QWEN3_RENDERER_TOKENS) -> list[str]:
    """The tokens of ``tokens`` that ``tokenizer`` has no single id for."""
    vocab = tokenizer.get_vocab()
    return [t for t in tokens if t not in vocab]


def renaming(tokenizer, tokens=QWEN3_RENDERER_TOKENS) -> dict[str, str]:
    """donor token -> the renderer token it becomes, for every token ``tokenizer`` lacks."""
    missing = missing_tokens(tokenizer, tokens)
    for required in ("<|im_start|>", "<|im_end|>"):
        if required in missing:
            raise ToolModelError(
                f"its tokenizer has no {required!r}; renaming tokens only suits ChatML models "
                "(whose turns the Qwen3 renderer writes)"
            )
    vocab = tokenizer.get_vocab()
    donors = [d for d in DONORS if d in vocab and d in tokenizer.all_special_tokens]
    if len(donors) < len(missing):
        raise ToolModelError(
            f"it lacks {missing} and has only {len(donors)} unused special tokens to rename "
            f"({donors}); give it the tokens another way"
        )
    return dict(zip(donors, missing, strict=False))


def _files_digest(source: Path) -> str:
    """A digest of every file's name and bytes (weights included: a source model replaced in
    place, at the same size, gets a new copy)."""
    h = hashlib.sha256()
    for path in sorted(p for p in source.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()[:16]


def with_renderer_tokens(model: str, tokens=QWEN3_RENDERER_TOKENS) -> Path:
    """The directory of ``model`` with ``tokens`` present (``model``'s own directory when it
    already has them all and no unknown token among them)."""
    from transformers import AutoTokenizer

    source = Path(resolve_model_path(model))
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    try:
        renamed = renaming(tokenizer, tokens)
    except ToolModelError as exc:
        raise ToolModelError(f"model={model!r}: {exc}") from None
    drop_unknown = tokenizer.unk_token in tokens
    if not renamed and not drop_unknown:
        return source
    key = hashlib.sha256(
        json.dumps([BUILD_REVISION, _files_digest(source), renamed, drop_unknown]).encode()
    ).hexdigest()[:16]
    target = cache_root() / "models" / "with-renderer-tokens" / f"{Path(model).name}-{key}"
    return build_once(target, lambda out: _build(source, renamed, drop_unknown, out))


def _rename(value, renamed: dict[str, str]):
    if isinstance(value, str):
        return renamed.get(value, value)
    if isinstance(value, list):
        return [_rename(v, renamed) for v in value]
    if isinstance(value, dict):
        return {k: _rename(v, renamed) for k, v in value.items()}
    return value


def _build(source: Path, renamed: dict[str, str], drop_unknown: bool, out: Path) -> None:
    for path in source.iterdir():
        if path.is_file() and path.name not in TOKENIZER_FILES and path.suffix != ".safetensors":
            shutil.copyfile(path, out / path.name)
    data = json.loads((source / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    _write_embeddings(source, out, data, renamed)
    for added in data["added_tokens"]:
        added["content"] = renamed.get(added["content"], added["content"])
    data["model"]["vocab"] = {renamed.get(k, k): v for k, v in vocab.items()}
    if drop_unknown:
        data["model"]["unk_token"] = None
    (out / "tokenizer.json").write_text(
        json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True)
    )
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if not (source / name).is_file():
            continue
        config = json.loads((source / name).read_text())
        unk = config.get("unk_token")
        config = {
            k: (v if k == "chat_template" else _rename(v, renamed)) for k, v in config.items()
        }
        if drop_unknown and unk is not None:
            config.pop("unk_token", None)
        if "added_tokens_decoder" in config:
            for entry in config["added_tokens_decoder"].values():
                entry["content"] = renamed.get(entry["content"], entry["content"])
        (out / name).write_text(json.dumps(config, indent=2, sort_keys=True))


EMBEDDING_KEYS = ("model.embed_tokens.weight", "lm_head.weight")


def _write_embeddings(source: Path, out: Path, data: dict, renamed: dict[str, str]) -> None:
    """Copy the safetensors files, giving each renamed token its own row (module docstring)."""
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer

    original = Tokenizer.from_str(json.dumps(data))
    vocab = data["model"]["vocab"]
    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise ToolModelError(f"{source} has no .safetensors weights to copy")
    special = {added["id"] for added in data["added_tokens"]}  # the norm is of text pieces
    found = False
    for path in files:
        tensors = load_file(str(path))
        for key in EMBEDDING_KEYS:
            if key not in tensors:
                continue
            found = True
            table = tensors[key].clone()
            ordinary = [i for i in range(table.shape[0]) if i not in special]
            norm = table[ordinary].float().norm(dim=-1).mean()
            generator = torch.Generator().manual_seed(EMBEDDING_SEED)
            for donor, name in renamed.items():
                pieces = original.encode(name, add_special_tokens=False).ids
                prior = table[pieces].float().mean(dim=0)
                noise = torch.randn(table.shape[1], generator=generator)
                row = (prior / prior.norm() + noise / noise.norm()) / 2**0.5
                table[vocab[donor]] = (row * norm).to(table.dtype)
            tensors[key] = table
        save_file(tensors, str(out / path.name), metadata={"format": "pt"})
    if not found:
        raise ToolModelError(f"{source}: no embedding table ({', '.join(EMBEDDING_KEYS)}) found")
