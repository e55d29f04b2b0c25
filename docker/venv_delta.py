"""Copy the files a journey's ``uv sync`` added to or changed in a venv, so the journey's image
adds one small layer on top of the shared runtime layers instead of a second copy of the venv.

    python3 docker/venv_delta.py snapshot /opt/venv /tmp/venv.manifest    # before the sync
    python3 docker/venv_delta.py copy /opt/venv /tmp/venv.manifest /delta  # after it

``snapshot`` records every file's path, size and mtime, and the sha256 of each ``.pyc``;
``copy`` copies each file that is new or differs in size or mtime to the same path under the
delta root (symlinks as symlinks), except a ``.pyc`` whose bytes are unchanged. uv compiles the
whole of site-packages after any install, not only what it installed, so a journey extra that
adds a few packages rewrote every ``.pyc`` of the shared venv with the same bytes and a new
mtime: TITO's delta was 30011 of 53639 files. The bytecode is hash-checked
(``SOURCE_DATE_EPOCH`` is set in the Dockerfile), so the shared layer's copy is the same file.
A file the sync removed fails the copy: the runtime layers would still hold it, so the delta
cannot express it (journey extras are supersets of ``local``, so nothing is removed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def scan(root: Path, hash_bytecode: bool = True) -> dict[str, list]:
    """path -> [size, mtime_ns] (+ sha256 for a regular ``.pyc`` file when ``hash_bytecode``)."""
    entries = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            entry: list = [info.st_size, info.st_mtime_ns]
            if hash_bytecode and name.endswith(".pyc") and path.is_file() and not path.is_symlink():
                entry.append(sha256(path))
            entries[str(path.relative_to(root))] = entry
    return entries


def changed(root: Path, rel: str, before: list | None, after: list) -> bool:
    """New, or another size or mtime; a ``.pyc`` rewritten with the same bytes is unchanged."""
    if before is None:
        return True
    if before[:2] == after[:2]:
        return False
    if len(before) == 3 and before[0] == after[0] and not (root / rel).is_symlink():
        return sha256(root / rel) != before[2]
    return True


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "snapshot":
        Path(argv[2]).write_text(json.dumps(scan(Path(argv[1]))))
        return 0
    if len(argv) >= 4 and argv[0] == "copy":
        root, before = Path(argv[1]), json.loads(Path(argv[2]).read_text())
        after = scan(root, hash_bytecode=False)
        removed = sorted(set(before) - set(after))
        if removed:
            print(f"venv_delta: the sync removed {len(removed)} file(s), e.g. {removed[:3]}")
            return 1
        target = Path(argv[3]) / root.relative_to("/")
        delta = sorted(p for p, stat in after.items() if changed(root, p, before.get(p), stat))
        kept = sum(1 for p, stat in after.items() if p in before and before[p][:2] != stat[:2])
        kept -= sum(1 for p in delta if p in before)
        for rel in delta:
            src, dst = root / rel, target / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
        print(
            f"venv_delta: {len(delta)} new or changed file(s) of {len(after)}"
            f" ({kept} .pyc file(s) rewritten with the same bytes left out)"
        )
        return 0
    print(__doc__)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
