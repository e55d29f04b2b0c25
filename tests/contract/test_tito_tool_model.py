"""A SmolLM2 copy with the Qwen3 renderer's tool tokens: each a single id with an embedding row
of its own, the renderer accepts it, every other weight is untouched, and text without the
renamed tokens tokenizes exactly as before."""

from __future__ import annotations

import pytest

pytest.importorskip("renderers")

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from cortex_recipes.models import resolve_model_path
from cortex_recipes.supervision import make_renderer
from cortex_recipes.tito import tool_model
from cortex_recipes.tito.tool_model import (
    QWEN3_RENDERER_TOKENS,
    ToolModelError,
    missing_tokens,
    with_renderer_tokens,
)

pytestmark = pytest.mark.contract
SMOLLM2 = "smollm2-135m-instruct"
EMBEDDINGS = "model.embed_tokens.weight"


def test_the_copy_is_built_in_the_writable_cache_when_the_fixture_is_baked(tmp_path, monkeypatch):
    """As in a journey's image: the fixture is read from a baked cache, the copy with the
    renderer's tokens lands in the user's writable cache (issue 34: it was written into the
    baked cache and failed with PermissionError as the image's user)."""
    source = resolve_model_path(SMOLLM2)  # built (or found) in the usual cache
    # A baked cache holding the fixture alone (the usual cache may already hold a copy with
    # the renderer's tokens from an earlier run, which would rightly be reused).
    baked = tmp_path / "baked"
    (baked / "models").mkdir(parents=True)
    fixture_dir = source.parent  # models/<name>/<build key>
    (baked / "models" / fixture_dir.name).symlink_to(fixture_dir, target_is_directory=True)
    monkeypatch.setenv("CORTEX_RECIPES_BAKED_CACHE", str(baked))
    monkeypatch.setenv("CORTEX_RECIPES_CACHE", str(tmp_path / "writable"))
    before = sorted(p.name for p in (baked / "models").iterdir())
    baked_fixture = resolve_model_path(SMOLLM2)
    assert baked_fixture.resolve() == source.resolve()  # the baked fixture, not a rebuild
    assert not (tmp_path / "writable" / "models" / fixture_dir.name).exists()
    copy = with_renderer_tokens(SMOLLM2)
    assert copy.is_relative_to(tmp_path / "writable" / "models" / "with-renderer-tokens")
    assert sorted(p.name for p in (baked / "models").iterdir()) == before


def test_the_copy_renames_unused_special_tokens_gives_them_rows_and_keeps_plain_text(
    tmp_path, monkeypatch
):
    source = resolve_model_path(SMOLLM2)  # the cached fixture
    monkeypatch.setenv("CORTEX_RECIPES_CACHE", str(tmp_path))  # the copy is built here
    original = AutoTokenizer.from_pretrained(source)
    assert "<tool_call>" in missing_tokens(original)
    copy = with_renderer_tokens(SMOLLM2)
    assert copy.parent.parent == tmp_path / "models" and with_renderer_tokens(SMOLLM2) == copy
    tokenizer = AutoTokenizer.from_pretrained(copy)
    assert missing_tokens(tokenizer) == [] and len(tokenizer) == len(original)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in QWEN3_RENDERER_TOKENS]
    assert len(set(ids)) == len(ids) and tokenizer.unk_token_id not in ids
    make_renderer(tokenizer, "qwen3")  # asserts each token is a single known id
    # the tool tokens take the donors' ids
    assert ids[3:5] == [
        original.convert_tokens_to_ids(d) for d in ("<issue_start>", "<issue_closed>")
    ]
    assert tokenizer.encode("<tool_call>x</tool_call>", add_special_tokens=False)[::2] == ids[3:5]
    before = load_file(str(source / "model.safetensors"))
    after = load_file(str(copy / "model.safetensors"))
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before if k != EMBEDDINGS)
    changed = (before[EMBEDDINGS] != after[EMBEDDINGS]).any(dim=-1).nonzero().flatten().tolist()
    assert sorted(changed) == sorted(ids[3:])  # only the six renamed tokens' rows
    rows = torch.nn.functional.normalize(after[EMBEDDINGS][ids[3:]], dim=-1)
    similarity = rows @ rows.T - torch.eye(len(changed))
    assert similarity.max() < 0.8  # distinct; the donors' own rows were identical
    donors = torch.nn.functional.normalize(before[EMBEDDINGS][ids[3:]], dim=-1)
    assert (donors @ donors.T).min() > 0.99
    text = "<|im_start|>user\nWhich town is older, Ashford or Belton? 1843<|im_end|>\n"
    assert tokenizer.encode(text, add_special_tokens=False) == original.encode(
        text, add_special_tokens=False
    )


class Vocab:
    def __init__(self, tokens, special):
        self.tokens, self.all_special_tokens, self.unk_token = tokens, special, None

    def get_vocab(self):
        return {t: i for i, t in enumerate(self.tokens)}


def test_a_model_without_chatml_or_spare_special_tokens_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(tool_model, "resolve_model_path", lambda name: tmp_path)
    plain = Vocab(["a", "b"], [])
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: plain)
    with pytest.raises(
        ToolModelError, match=r"model='plain': its tokenizer has no '<\|im_start\|>'"
    ):
        with_renderer_tokens("plain")
    chatml = Vocab(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<issue_start>"],
                   ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<issue_start>"])  # fmt: skip
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: chatml)
    with pytest.raises(ToolModelError, match=r"has only 1 unused special tokens to rename"):
        with_renderer_tokens("chatml")


def test_the_copy_is_keyed_by_the_source_files_bytes_not_only_their_sizes(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x00" * 64)
    before = tool_model._files_digest(tmp_path)
    weights.write_bytes(b"\x00" * 63 + b"\x01")  # same size, one byte replaced in place
    assert tool_model._files_digest(tmp_path) != before
    weights.write_bytes(b"\x00" * 64)
    assert tool_model._files_digest(tmp_path) == before
