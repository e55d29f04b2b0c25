"""Copy the files a journey's ``uv sync`` added to or changed in a venv, so the journey's image
adds one small layer on top of the shared runtime layers instead of a second copy of the venv.

    python3 docker/venv_delta.py snapshot /opt/venv /tmp/venv.manifest    # before the sync
    python3 docker/venv_delta.py copy /opt/venv /tmp/venv.manifest /delta  # after it

``snapshot`` records every file's path, size and mtime; ``copy`` copies each file that is new or
differs in size or mtime to the same path under the delta root (symlinks as symlinks). A file
the sync removed fails the copy: the runtime layers would still hold it, so the delta cannot
express it (journey extras are supersets of ``local``, so nothing is removed).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


def scan(root: Path) -> dict[str, list[int]]:
    entries = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            entries[str(path.relative_to(root))] = [info.st_size, info.st_mtime_ns]
    return entries


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "snapshot":
        Path(argv[2]).write_text(json.dumps(scan(Path(argv[1]))))
        return 0
    if len(argv) >= 4 and argv[0] == "copy":
        root, before = Path(argv[1]), json.loads(Path(argv[2]).read_text())
        after = scan(root)
        removed = sorted(set(before) - set(after))
        if removed:
            print(f"venv_delta: the sync removed {len(removed)} file(s), e.g. {removed[:3]}")
            return 1
        target = Path(argv[3]) / root.relative_to("/")
        changed = sorted(p for p, stat in after.items() if before.get(p) != stat)
        for rel in changed:
            src, dst = root / rel, target / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
        print(f"venv_delta: {len(changed)} new or changed file(s) of {len(after)}")
        return 0
    print(__doc__)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
