"""Build, smoke-test and remove one image per journey, from journeys.toml and uv.lock.

    python ci/images.py                                 # every landed journey: build, smoke, remove
    python ci/images.py --journey sft --keep            # one journey, keep the image
    python ci/images.py --base localhost/cortex-ci-base:bookworm   # CI: a local base image
    python ci/images.py --journey sft --reproducible    # build twice, compare image IDs

Images are tagged ``cortex/<journey>:<version>`` and ``cortex/<journey>:pinned``. They are
built with ``SOURCE_DATE_EPOCH`` set to the commit time and ``--timestamp`` at that time, so
the same commit and base give the same image. The OCI labels carry the source, revision,
version, journey and uv.lock hash. A JSON line per journey goes to stdout: build and smoke
seconds, image size and digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    return subprocess.run(command, check=True, **kwargs)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def landed_journeys() -> list[dict]:
    data = tomllib.loads((ROOT / "journeys.toml").read_text())
    return [j for j in data["journey"] if j["status"] == "landed"]


def build_args(journey: dict, base: str | None) -> tuple[list[str], str]:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    epoch = git("log", "-1", "--format=%ct")
    args = {
        "JOURNEY": journey["name"],
        "JOURNEY_EXTRA": journey["extra"],
        "VERSION": version,
        "REVISION": git("rev-parse", "HEAD"),
        "LOCK_SHA256": hashlib.sha256((ROOT / "uv.lock").read_bytes()).hexdigest(),
        "SOURCE_DATE_EPOCH": epoch,
    }
    if base:
        args["BASE_IMAGE"] = base
    flags = []
    for key, value in args.items():
        flags += ["--build-arg", f"{key}={value}"]
    return flags + ["--timestamp", epoch], version  # build() maps --timestamp per engine


def image_digest(engine: str, tag: str) -> str:
    return run(
        [engine, "image", "inspect", "--format", "{{.Digest}}", tag], capture_output=True, text=True
    ).stdout.strip()


def image_id(engine: str, tag: str) -> str:
    """The image ID: the digest of the image's config, which names its layers' digests. Both
    docker and podman report it (``.Digest``, a manifest digest, may be empty on docker), so
    reproducibility compares this."""
    return run(
        [engine, "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True
    ).stdout.strip()


def same_image(first: str, second: str) -> bool:
    """Two builds are the same image only if both IDs are known and equal."""
    if not first or not second:
        raise ValueError(f"cannot compare image IDs {first!r} and {second!r}: one is empty")
    return first == second


def image_size(engine: str, tag: str) -> int:
    out = run(
        [engine, "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True, text=True
    )
    return int(out.stdout.strip() or 0)


def build(engine: str, journey: dict, base: str | None, tag: str, no_cache: bool = False) -> float:
    flags, _ = build_args(journey, base)
    epoch = flags[-1]
    flags = flags[:-2]  # the trailing --timestamp is podman's spelling
    if engine == "docker":
        # BuildKit: SOURCE_DATE_EPOCH (a build arg) fixes the created time; rewrite-timestamp
        # clamps file times in the layers to it. (Not exercised on the CI machine, which uses
        # podman; the GitHub workflow runs this path.)
        command = [
            "docker", "buildx", "build", "--provenance=false",
            "--output", f"type=docker,name={tag},rewrite-timestamp=true",
        ]  # fmt: skip
    else:
        command = [engine, "build", "--format", "docker", "--timestamp", epoch, "-t", tag]
    if no_cache:
        command.append("--no-cache")
    started = time.monotonic()
    run([*command, "-f", "docker/Dockerfile", *flags, "."], cwd=ROOT)
    return time.monotonic() - started


def build_deps(engine: str, base: str | None) -> str | None:
    """Build and tag the journey-independent ``deps`` stage once (podman), so that every
    journey's build reuses its layers and pruning one journey's leftovers keeps them. BuildKit
    (docker) caches stages on its own; there this returns None."""
    if engine == "docker":
        return None
    flags, _ = build_args({"name": "deps", "extra": "local"}, base)
    epoch = flags[-1]
    tag = "cortex-recipes-deps:" + hashlib.sha256((ROOT / "uv.lock").read_bytes()).hexdigest()[:12]
    command = [engine, "build", "--format", "docker", "--timestamp", epoch, "--target", "deps"]
    run([*command, "-t", tag, "-f", "docker/Dockerfile", *flags[:-2], "."], cwd=ROOT)
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="podman")
    parser.add_argument("--base", default=None, help="base image in place of the pinned one")
    parser.add_argument("--journey", action="append", help="only these journeys (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the images")
    parser.add_argument("--no-smoke", action="store_true")
    parser.add_argument(
        "--reproducible",
        action="store_true",
        help="build twice without the layer cache and compare image IDs",
    )
    args = parser.parse_args(argv)

    journeys = landed_journeys()
    if args.journey:
        unknown = sorted(set(args.journey) - {j["name"] for j in journeys})
        if unknown:
            parser.error(f"unknown or not landed journeys {unknown}")
        journeys = [j for j in journeys if j["name"] in args.journey]
    failed = []
    deps = None if args.reproducible else build_deps(args.engine, args.base)
    for journey in journeys:
        _, version = build_args(journey, args.base)
        tag = f"cortex/{journey['name']}:{version}"
        pinned = f"cortex/{journey['name']}:pinned"
        result = {"journey": journey["name"], "image": tag}
        try:
            result["build_s"] = round(
                build(args.engine, journey, args.base, tag, no_cache=args.reproducible), 1
            )
            run([args.engine, "tag", tag, pinned])
            result["digest"] = image_digest(args.engine, tag)
            result["size_mb"] = round(image_size(args.engine, tag) / 2**20)
            if args.reproducible:
                again = f"{tag}-again"
                build(args.engine, journey, args.base, again, no_cache=True)
                result["id"] = image_id(args.engine, tag)
                result["id_again"] = image_id(args.engine, again)
                result["reproducible"] = same_image(result["id"], result["id_again"])
                run([args.engine, "rmi", again])
                if not result["reproducible"]:
                    failed.append(journey["name"])
            if not args.no_smoke:
                started = time.monotonic()
                smoke = subprocess.run([args.engine, "run", "--rm", pinned, "smoke"], check=False)
                result["smoke_s"] = round(time.monotonic() - started, 1)
                result["smoke_rc"] = smoke.returncode
                if smoke.returncode != 0:
                    failed.append(journey["name"])
        except (subprocess.CalledProcessError, ValueError) as exc:
            result["error"] = str(exc)
            failed.append(journey["name"])
        finally:
            if not args.keep:
                subprocess.run(
                    [args.engine, "rmi", "--force", tag, pinned], check=False, capture_output=True
                )
                # The build stage's untagged images (the whole venv, several GB each) outlive
                # `rmi` of the final image; without this, five journeys fill a CI disk.
                subprocess.run(
                    [args.engine, "image", "prune", "--force"], check=False, capture_output=True
                )
            result["disk_free_gb"] = round(shutil.disk_usage("/").free / 2**30, 1)
        print(json.dumps(result), flush=True)
    if deps and not args.keep:
        subprocess.run([args.engine, "rmi", "--force", deps], check=False, capture_output=True)
        subprocess.run([args.engine, "image", "prune", "--force"], check=False, capture_output=True)
    if failed:
        print(f"failed: {sorted(set(failed))}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
