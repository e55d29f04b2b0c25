"""Chunk reassembly: idempotent, checked by cortex_training.wire, bounded in memory."""

from __future__ import annotations

import pytest
import torch
from cortex_training import wire

from cortex_recipes.local import chunks
from cortex_recipes.local.bodies import request_chunk
from cortex_recipes.local.chunks import ChunkAssembler
from cortex_recipes.local.errors import BackendError, Conflict

pytestmark = pytest.mark.unit


def _chunked(seed: int, n_chunks: int = 3, group: str | None = None) -> list[bytes]:
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(seed))
    frame = wire.dumps({"args": (), "kwargs": {"input_ids": ids}})
    size = len(frame) // n_chunks + 8192 + 64
    out = wire.encode_byte_chunks(
        frame, kind="request", max_bytes=size, chunk_group_id=group or f"g{seed}", force_chunk=True
    )
    assert len(out) >= 2
    return out


def _send(assembler: ChunkAssembler, data: bytes):
    return assembler.accept(request_chunk(data, "test"), data)


def test_a_group_reassembles_to_the_original_frame_and_then_holds_no_bytes():
    assembler = ChunkAssembler()
    parts = _chunked(0)
    for part in parts[:-1]:
        assert _send(assembler, part).frame is None
    assert assembler.held_bytes() > 0
    done = _send(assembler, parts[-1])
    assert wire.loads(done.frame)["kwargs"]["input_ids"].shape == (2, 64)
    assembler.ran(request_chunk(parts[-1], "test"), "req-1")
    assert assembler.held_bytes() == 0
    # A replay of the whole group returns the first request id and never a frame to run again.
    for part in parts[:-1]:
        assert _send(assembler, part).frame is None
    replay = _send(assembler, parts[-1])
    assert (replay.frame, replay.request_id) == (None, "req-1")


def test_memory_stays_flat_over_many_chunked_requests():
    assembler = ChunkAssembler()
    for seed in range(60):
        parts = _chunked(seed)
        for part in parts:
            accepted = _send(assembler, part)
        assembler.ran(request_chunk(parts[-1], "test"), f"req-{seed}")
        assert accepted.frame is not None
        assert assembler.held_bytes() == 0
    assert assembler.group_counts() == (0, 60)


def test_finished_groups_are_remembered_up_to_a_bound(monkeypatch):
    monkeypatch.setattr(chunks, "MAX_FINISHED_GROUPS", 5)
    assembler = ChunkAssembler()
    for seed in range(8):
        parts = _chunked(seed)
        for part in parts:
            _send(assembler, part)
        assembler.ran(request_chunk(parts[-1], "test"), f"req-{seed}")
    assert assembler.group_counts() == (0, 5)


def test_incomplete_groups_expire_after_the_ttl_and_must_restart():
    now = [0.0]
    assembler = ChunkAssembler(clock=lambda: now[0])
    parts = _chunked(1)
    _send(assembler, parts[0])
    assert assembler.group_counts() == (1, 0)
    now[0] = chunks.INCOMPLETE_TTL_S + 1
    with pytest.raises(Conflict) as err:
        _send(assembler, parts[1])
    assert err.value.code == "chunk_group_restart_required"
    assert assembler.held_bytes() == 0


def test_incomplete_groups_beyond_the_count_bound_drop_the_oldest(monkeypatch):
    monkeypatch.setattr(chunks, "MAX_INCOMPLETE_GROUPS", 3)
    assembler = ChunkAssembler()
    firsts = [_chunked(seed) for seed in range(5)]
    for parts in firsts:
        _send(assembler, parts[0])
    assert assembler.group_counts() == (3, 0)
    with pytest.raises(Conflict, match="replay from chunk 0"):
        _send(assembler, firsts[0][1])


def test_conflicting_chunks_are_409s_with_the_sdk_codes():
    assembler = ChunkAssembler()
    a, b = _chunked(2, group="same"), _chunked(3, group="same")
    _send(assembler, a[0])
    with pytest.raises(Conflict) as err:
        _send(assembler, b[0])
    assert err.value.code == "chunk_group_conflict"
    with pytest.raises(Conflict) as err:
        _send(assembler, a[-1])
    assert err.value.code == "chunk_group_missing_chunks"


def test_malformed_chunk_metadata_is_a_400_that_names_the_field():
    payload = {"payload": torch.zeros(4, dtype=torch.uint8)}
    for metadata, field in [
        ({"request_chunk": 5}, "request_chunk=5"),
        ({"request_chunk": {"chunk_group_id": "g", "chunk_idx": "0"}}, "total_chunks"),
        (
            {
                "request_chunk": {
                    "chunk_group_id": "g",
                    "chunk_idx": 0,
                    "total_chunks": 1,
                    "frame_sha256": "xyz",
                    "frame_size_bytes": 4,
                }
            },
            "frame_sha256",
        ),
        (
            {
                "request_chunk": {
                    "chunk_group_id": "g\n",
                    "chunk_idx": 0,
                    "total_chunks": 1,
                    "frame_sha256": "0" * 64,
                    "frame_size_bytes": 4,
                }
            },
            "chunk_group_id",
        ),
    ]:
        with pytest.raises(BackendError, match=field):
            request_chunk(wire.dumps(payload, metadata=metadata), "forward-backward")


def _altered(chunk: bytes) -> bytes:
    """The same chunk (its descriptor untouched) with one payload byte changed."""
    return chunk[:-1] + bytes([chunk[-1] ^ 0xFF])


def test_a_retry_with_other_bytes_is_a_409_before_and_after_the_group_ran():
    """A chunk resent under the same group with different bytes is a conflicting write: never
    taken, whether its group is still assembling or already ran (then the 409 names the
    request it produced); the same bytes replay as before."""
    assembler = ChunkAssembler()
    parts = _chunked(4, group="retry")
    _send(assembler, parts[0])
    _send(assembler, parts[1])
    with pytest.raises(Conflict, match="chunk 1 of group retry was sent with different bytes"):
        _send(assembler, _altered(parts[1]))
    for part in parts[2:]:
        done = _send(assembler, part)
    assembler.ran(request_chunk(parts[-1], "test"), "req-9")
    with pytest.raises(Conflict) as err:
        _send(assembler, _altered(parts[1]))
    assert err.value.code == "chunk_group_conflict" and err.value.status == 409
    assert "chunk 1 of group retry (request req-9)" in str(err.value)
    with pytest.raises(Conflict, match=r"chunk \d+ of group retry \(request req-9\)"):
        _send(assembler, _altered(parts[-1]))
    assert _send(assembler, parts[1]).frame is None  # an honest replay is still accepted
    assert _send(assembler, parts[-1]).request_id == "req-9"
    assert done.frame is not None
