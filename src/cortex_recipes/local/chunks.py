"""Reassembly of request-chunked frames, idempotent per ``chunk_group_id`` and bounded in memory.

Invariants:
- A group is bound to its first chunk's ``frame_sha256``, ``total_chunks`` and
  ``frame_size_bytes``; a later chunk that disagrees, or resends an index with other bytes, is a
  409 ``chunk_group_conflict``. An unknown group must start at chunk 0 (409
  ``chunk_group_restart_required``), and a final chunk sent while others are missing is a 409
  ``chunk_group_missing_chunks``.
- The size and sha256 checks of the reassembled frame are ``cortex_training.wire``'s own
  (:func:`wire.decode_byte_chunks`), not a second copy of them.
- A group runs at most once: once it has produced a request it keeps only what replay needs
  (the binding, the request id and each chunk's sha256), never its bytes. A replayed final
  chunk returns the same request id; a replayed chunk with other bytes than the one received
  is a 409 ``chunk_group_conflict`` naming the chunk index, the group and the request id.
- Memory is bounded: incomplete groups expire after :data:`INCOMPLETE_TTL_S` and at most
  :data:`MAX_INCOMPLETE_GROUPS` / :data:`MAX_INCOMPLETE_BYTES` of them are held (oldest dropped
  first; a dropped group restarts from chunk 0); at most :data:`MAX_FINISHED_GROUPS` finished
  groups are remembered.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from cortex_training import wire

from cortex_recipes.local.bodies import ChunkDescriptor
from cortex_recipes.local.errors import BackendError, Conflict

# A client sends a group's chunks back to back; ten minutes idle means it gave up.
INCOMPLETE_TTL_S = 600.0
# A handful of concurrent chunked requests per job is all any SDK client produces.
MAX_INCOMPLETE_GROUPS = 16
# Two 60 MiB frames' worth per job waiting for their last chunk, at most.
MAX_INCOMPLETE_BYTES = 256 * 1024 * 1024
# Replays come within seconds; remember the ids of the last this-many executions.
MAX_FINISHED_GROUPS = 1024


@dataclass
class _Group:
    frame_sha256: str
    total: int
    frame_size: int
    touched: float
    chunks: dict[int, bytes] = field(default_factory=dict)  # index -> the chunk's own frame
    digests: dict[int, str] = field(default_factory=dict)  # index -> sha256 of that frame

    @property
    def held_bytes(self) -> int:
        return sum(len(c) for c in self.chunks.values())


@dataclass(frozen=True)
class _Finished:
    """What a group that ran keeps: its binding, the request it produced and each chunk's
    sha256 (a replayed chunk must carry the same bytes), never the bytes."""

    binding: tuple[str, int, int]
    request_id: str
    digests: dict[int, str]


@dataclass(frozen=True)
class Accepted:
    """What one chunk did: ``frame`` is set when it completed its group (run it now);
    ``request_id`` when the group already ran (a replay)."""

    received: int
    frame: bytes | None = None
    request_id: str | None = None


class ChunkAssembler:
    """The chunk groups of one job."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._incomplete: OrderedDict[str, _Group] = OrderedDict()
        self._finished: OrderedDict[str, _Finished] = OrderedDict()
        # chunk digests of groups completed but not yet recorded by ran() (a few at most)
        self._digests: OrderedDict[str, dict[int, str]] = OrderedDict()
        self._lock = threading.Lock()

    def held_bytes(self) -> int:
        """Bytes of chunk payload this assembler holds right now."""
        with self._lock:
            return sum(g.held_bytes for g in self._incomplete.values())

    def group_counts(self) -> tuple[int, int]:
        with self._lock:
            return len(self._incomplete), len(self._finished)

    def _expire(self, now: float) -> None:
        stale = [g for g, grp in self._incomplete.items() if now - grp.touched > INCOMPLETE_TTL_S]
        for group_id in stale:
            del self._incomplete[group_id]

    def _bound(self) -> None:
        """Drop the least recently touched incomplete groups beyond the bounds."""
        while len(self._incomplete) > MAX_INCOMPLETE_GROUPS or (
            len(self._incomplete) > 1
            and sum(g.held_bytes for g in self._incomplete.values()) > MAX_INCOMPLETE_BYTES
        ):
            self._incomplete.popitem(last=False)

    def accept(self, desc: ChunkDescriptor, data: bytes) -> Accepted:
        binding = (desc.frame_sha256, desc.total, desc.frame_size)
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            now = self._clock()
            self._expire(now)
            finished = self._finished.get(desc.group_id)
            if finished is not None:
                if finished.binding != binding:
                    raise Conflict(
                        f"chunk_group_id {desc.group_id} was already used for a different frame",
                        code="chunk_group_conflict",
                    )
                if finished.digests.get(desc.index, digest) != digest:
                    raise Conflict(
                        f"chunk {desc.index} of group {desc.group_id} (request "
                        f"{finished.request_id}) was sent with different bytes than the chunk "
                        "already received; a retry must resend the same bytes",
                        code="chunk_group_conflict",
                    )
                self._finished.move_to_end(desc.group_id)
                if desc.index == desc.total - 1:
                    return Accepted(received=desc.total, request_id=finished.request_id)
                return Accepted(received=desc.index + 1)
            group = self._incomplete.get(desc.group_id)
            if group is None:
                if desc.index != 0:
                    raise Conflict(
                        "request chunk group is unknown; replay from chunk 0",
                        code="chunk_group_restart_required",
                    )
                group = _Group(desc.frame_sha256, desc.total, desc.frame_size, touched=now)
                self._incomplete[desc.group_id] = group
            if (group.frame_sha256, group.total, group.frame_size) != binding:
                raise Conflict(
                    f"chunk_group_id {desc.group_id} was already used for a different frame",
                    code="chunk_group_conflict",
                )
            if desc.index in group.digests and group.digests[desc.index] != digest:
                raise Conflict(
                    f"chunk {desc.index} of group {desc.group_id} was sent with different bytes",
                    code="chunk_group_conflict",
                )
            group.chunks[desc.index] = data
            group.digests[desc.index] = digest
            group.touched = now
            self._incomplete.move_to_end(desc.group_id)
            self._bound()
            if len(group.chunks) < group.total:
                if desc.index == group.total - 1:
                    missing = sorted(set(range(group.total)) - set(group.chunks))
                    raise Conflict(
                        f"request chunk group is missing chunks {missing[:10]}",
                        code="chunk_group_missing_chunks",
                    )
                return Accepted(received=len(group.chunks))
            del self._incomplete[desc.group_id]
            self._digests[desc.group_id] = dict(group.digests)  # for ran(): replays check them
            while len(self._digests) > MAX_INCOMPLETE_GROUPS:  # completed groups that never ran
                self._digests.popitem(last=False)
        try:
            frame = wire.decode_byte_chunks(
                [group.chunks[i] for i in range(group.total)], kind="request"
            )
        except wire.WireError as exc:
            raise BackendError(f"request chunk group {desc.group_id}: {exc}") from exc
        return Accepted(received=group.total, frame=frame)

    def ran(self, desc: ChunkDescriptor, request_id: str) -> None:
        """Record that a completed group produced ``request_id`` (its bytes are already gone)."""
        with self._lock:
            self._finished[desc.group_id] = _Finished(
                (desc.frame_sha256, desc.total, desc.frame_size),
                request_id,
                self._digests.pop(desc.group_id, {}),
            )
            while len(self._finished) > MAX_FINISHED_GROUPS:
                self._finished.popitem(last=False)
