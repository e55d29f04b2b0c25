"""Build, smoke-test and remove one image per journey, from journeys.toml and uv.lock.

    python ci/images.py                                 # every landed journey: build, smoke,
                                                        # train to the first step, remove
    python ci/images.py --journey sft --keep            # one journey, keep the image
    python ci/images.py --base localhost/cortex-ci-base:bookworm   # CI: a local base image
    python ci/images.py --journey sft --reproducible    # build twice, compare image IDs
    python ci/images.py --journey sft --qualify sft     # CI: build, smoke, CPU qualify in the image
    python ci/images.py --journey tito --stop tito      # and `<engine> stop` a running train
    python ci/images.py qualify --journey sft [--profile P] [--gpus] [--out DIR]   # a built image
    python ci/images.py --journey grpo --primerl-clones DIR   # and grpo's prime-rl variant from
                                                        # local clones (ci/primerl_image.py)

``qualify`` runs the image's ``qualify`` verb with a directory mounted at /out, the image ID
passed in as ``CORTEX_RECIPES_IMAGE_DIGEST``, and then checks the record it wrote there: it
passed, it has every record field, its config hash is the config's in this checkout, and its
revision and image digest are not null (``cortex_recipes.repo_checks.records.check_image_record``).

Images are tagged ``cortex/<journey>:<version>`` and ``cortex/<journey>:pinned``. They are
built with ``SOURCE_DATE_EPOCH`` set to the commit time and ``--timestamp`` at that time, so
the same commit and base give the same image. The OCI labels carry the source, revision,
version, journey and uv.lock hash. A JSON line per journey goes to stdout: build, smoke and
qualify seconds, image size and digest.

The journey-independent stages (``runtime``: the base, the ``local`` venv synced in place and
the baked-in model fixtures; ``toolchain``: that venv plus a compiler and uv) are built and
tagged once; each journey's image is ``runtime`` plus a small layer (the files its extra and
the project add to the venv, the recipes).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "ci"))
import primerl_image  # noqa: E402


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    return subprocess.run(command, check=True, **kwargs)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


class EngineError(RuntimeError):
    """The container engine cannot build these images; the message is one line with the fix."""


def pick_engine(engine: str, *, which=None, probe=None) -> tuple[str, str | None]:
    """``(engine to use, a note to print or None)``.

    The Dockerfile mounts build stages (``RUN --mount``), which only BuildKit can build: on
    Docker that is the buildx plugin (Docker's legacy ``docker build`` stops at the first
    ``--mount``). Without buildx the build goes to podman when it is installed (it builds the
    same Dockerfile; the images are then in podman's store), and fails in one line otherwise.
    ``which`` and ``probe(command) -> bool`` find and run commands (tests pass their own)."""
    which = which or shutil.which
    if probe is None:

        def probe(command: list[str]) -> bool:
            try:
                done = subprocess.run(command, capture_output=True, check=False, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                return False
            return done.returncode == 0

    if which(engine) is None:
        other = "podman" if engine == "docker" else "docker"
        hint = f" (or pass --engine {other}, which is installed)" if which(other) else ""
        raise EngineError(f"{engine} is not installed or not on PATH: install it{hint}")
    if engine != "docker" or probe(["docker", "buildx", "version"]):
        return engine, None
    fix = (
        "install Docker's buildx plugin (Debian/Ubuntu: apt install docker-buildx, or "
        "docker-buildx-plugin from Docker's repository)"
    )
    if which("podman") is not None:
        return "podman", (
            "docker buildx is missing and the Dockerfile needs BuildKit (RUN --mount): building "
            f"with podman instead; run the images with podman, or {fix}"
        )
    raise EngineError(
        f"docker buildx is missing and the Dockerfile needs BuildKit (RUN --mount): {fix}, "
        "or install podman and pass --engine podman"
    )


def describe_failure(exc: Exception) -> str:
    """One line for a failed step: the command, its exit status and what usually fixes it."""
    if not isinstance(exc, subprocess.CalledProcessError):
        return str(exc)
    command = exc.cmd if isinstance(exc.cmd, list) else [str(exc.cmd)]
    head = " ".join(str(part) for part in command[:3])
    hints = {
        125: "the engine refused the command (daemon not running, no permission, or a bad flag)",
        126: "the entry point could not be executed",
        127: "the command was not found in the image",
        137: "killed (out of memory, or a stop that timed out)",
    }
    hint = hints.get(exc.returncode, "its output above says why")
    return f"`{head} ...` exited {exc.returncode}: {hint}"


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


# Every stage a journey's build reuses is tagged, "uv" and "fixtures" included: the prune after
# each journey removes untagged stage images, and a pruned "uv" stage (the RUN that installs
# uv) is rebuilt with a new id, which misses the cache of every stage mounting it: each later
# journey then rebuilt the whole venv (5-6 min a journey instead of under one). "uv" and
# "fixtures" come last, as cache hits of what the first two built: building "uv" on its own
# first and then the venv stage, which bind-mounts it, fails in buildah ("couldn't find
# .../opt/uv on host to bind mount") when the mounted stage is a cache hit and the stage
# mounting it is not.
SHARED_STAGES = ("toolchain", "runtime", "uv", "fixtures")


def build_shared(engine: str, base: str | None) -> list[str]:
    """Build and tag the journey-independent stages once (podman), so that every journey's build
    reuses their layers and pruning one journey's leftovers keeps them. BuildKit (docker)
    caches stages on its own; there this returns []."""
    if engine == "docker":
        return []
    flags, _ = build_args({"name": "shared", "extra": "local"}, base)
    epoch = flags[-1]
    lock12 = hashlib.sha256((ROOT / "uv.lock").read_bytes()).hexdigest()[:12]
    tags = []
    for stage in SHARED_STAGES:
        tag = f"cortex-recipes-{stage}:{lock12}"
        command = [engine, "build", "--format", "docker", "--timestamp", epoch, "--target", stage]
        started = time.monotonic()
        run([*command, "-t", tag, "-f", "docker/Dockerfile", *flags[:-2], "."], cwd=ROOT)
        print(json.dumps({"stage": stage, "build_s": round(time.monotonic() - started, 1)}))
        tags.append(tag)
    return tags


def qualify_image(
    engine: str,
    journey: str,
    image: str,
    *,
    profile: str | None = None,
    out: Path | None = None,
    gpus: bool = False,
) -> dict:
    """Run ``qualify`` in ``image`` with ``out`` mounted at /out; check the record it wrote."""
    from cortex_recipes.repo_checks.records import check_image_record

    out = Path(out or tempfile.mkdtemp(prefix=f"qualify-{journey}-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    identity = image_id(engine, image)
    command = [
        engine, "run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}",
        "-v", f"{out}:/out",
        "-e", f"CORTEX_RECIPES_IMAGE_DIGEST={identity}",
        "-e", f"CORTEX_RECIPES_IMAGE_DIGEST_SOURCE=ci/images.py: {engine} image inspect {{{{.Id}}}}",
    ]  # fmt: skip
    if gpus:
        command += ["--gpus", "all"] if engine == "docker" else ["--device", "nvidia.com/gpu=all"]
    hf_cache = os.environ.get("HF_CACHE")
    if hf_cache:  # the host's Hugging Face hub cache, read-only, where the image looks
        command += ["-v", f"{Path(hf_cache).resolve()}:/hf-cache:ro"]
    command += [image, "qualify"] + ([f"profile={profile}"] if profile else [])
    started = time.monotonic()
    proc = subprocess.run(command, check=False)
    result = {
        "qualify_s": round(time.monotonic() - started, 1),
        "qualify_rc": proc.returncode,
        "qualify_out": str(out),
    }
    records = sorted((out / "evidence").glob("*.json"))
    passed = [r for r in records if not r.name.endswith(".failed.json")]
    if proc.returncode != 0 or len(passed) != 1:
        result["qualify_problems"] = [
            f"qualify exited {proc.returncode} and wrote {[r.name for r in records]} under "
            f"{out / 'evidence'}; expected exactly one passing record"
        ]
        return result
    record = json.loads(passed[0].read_text())
    result["qualify_record"] = str(passed[0])
    result["qualify_profile"] = record.get("profile")
    result["qualify_problems"] = check_image_record(ROOT, journey, record, image_id=identity)
    return result


# The overrides that stop each journey's default config (`train` with no profile) after its
# first optimizer step; `train` in CI runs with these, as the image's own non-root user, whose
# baked model cache is read-only (issue 34: TITO's default wrote a model copy into it).
FIRST_STEP = {
    "sft": ["steps=1"],
    "opd": ["steps=1"],
    "grpo": ["steps=1"],
    "math_grpo": ["steps=1"],
    "tito": ["warm_start_steps=1", "steps=1", "final_eval=false"],  # one eval, not two
}
# The grpo image holds no prime-rl environment (CI cannot reach GitHub): its `train` must stop
# at once and say what to do, naming these.
PRIMERL_ADVICE = ("CORTEX_RECIPES_PRIMERL_PYTHON", "install.sh", "docker/primerl.Dockerfile")


def train_image(engine: str, journey: str, image: str) -> dict:
    """Run the image's ``train`` verb with the journey's default config up to its first step
    (FIRST_STEP), as the image's default (non-root) user; the grpo journey must instead stop
    with PRIMERL_ADVICE. Returns seconds, exit code and the problems found (empty: passed)."""
    if journey not in FIRST_STEP:
        return {"train_problems": [f"no first-step override for journey {journey!r} (FIRST_STEP)"]}
    started = time.monotonic()
    proc = subprocess.run(
        [engine, "run", "--rm", image, "train", *FIRST_STEP[journey]],
        check=False, capture_output=True, text=True,
    )  # fmt: skip
    result = {"train_s": round(time.monotonic() - started, 1), "train_rc": proc.returncode}
    output = proc.stdout + proc.stderr
    if journey == "grpo":
        missing = [word for word in PRIMERL_ADVICE if word not in output]
        problems = (["train exited 0 without a prime-rl environment"] if proc.returncode == 0
                    else [])  # fmt: skip
        problems += [f"train's message does not name {word}" for word in missing]
    else:
        problems = [] if proc.returncode == 0 else [f"train exited {proc.returncode}"]
    if problems:
        sys.stderr.write(output[-4000:])
    result["train_problems"] = problems
    return result


#: the line a journey logs once its local backend answers: the stop check signals after it,
#: so that a backend and its workers are running when the container is stopped
BACKEND_UP = "local backend at"
#: `docker stop`'s default wait before SIGKILL; the container must be gone within it
STOP_TIMEOUT_S = 10


#: how long the stop check watches ``train`` print after its backend is up, before stopping it
WATCH_S = 75.0
#: the longest silence allowed while watching: the plain progress lines' period (30 s,
#: cortex_recipes.progress) and 5 s for a line to reach the engine's log
MAX_SILENCE_S = 35.0


def longest_silence(times: list[float], start: float, end: float) -> float:
    """The longest gap between ``start``, the line times within it and ``end``, in seconds."""
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in itertools.pairwise(points))


def stop_image(engine: str, image: str, wait_s: float = 600.0, watch_s: float = WATCH_S) -> dict:
    """Start ``train`` in ``image`` without a terminal; once its backend is up, watch its output
    for ``watch_s`` (no silence over MAX_SILENCE_S: the plain progress lines), then ``<engine>
    stop`` it with the default 10 s timeout: the container must exit by itself (not 137, the
    engine's SIGKILL), within those 10 s, saying what resumes the run. Returns seconds, the
    longest silence, exit code and problems."""
    import threading

    name = f"cortex-stop-check-{os.getpid()}"
    proc = subprocess.Popen(
        [engine, "run", "--rm", "--name", name, image, "train"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    while not any(BACKEND_UP in line for _, line in list(lines)):
        if proc.poll() is not None or time.monotonic() - started > wait_s:
            subprocess.run([engine, "rm", "--force", name], check=False, capture_output=True)
            return {"stop_problems": [f"train never logged {BACKEND_UP!r} (rc {proc.poll()})"]}
        time.sleep(0.5)
    up = time.monotonic()
    result = {"stop_after_s": round(up - started, 1)}
    while time.monotonic() - up < watch_s and proc.poll() is None:
        time.sleep(0.5)
    signalled = time.monotonic()
    silence = longest_silence([t for t, _ in list(lines)], up, signalled)
    result.update(watched_s=round(signalled - up, 1), longest_silence_s=round(silence, 1))
    subprocess.run(
        [engine, "stop", "--time", str(STOP_TIMEOUT_S), name], check=False, capture_output=True
    )
    returncode = proc.wait(timeout=60)
    reader.join(timeout=10)
    result.update(stop_s=round(time.monotonic() - signalled, 1), stop_rc=returncode)
    output = "".join(line for _, line in lines)
    problems = []
    if silence > MAX_SILENCE_S:
        problems.append(
            f"train printed nothing for {silence:.1f} s while running (at most {MAX_SILENCE_S})"
        )
    if returncode == 137:
        problems.append("the engine had to SIGKILL the container (rc 137): SIGTERM did not stop it")
    elif returncode != 143:
        problems.append(f"train exited {returncode} on SIGTERM (143 expected)")
    if result["stop_s"] > STOP_TIMEOUT_S:
        problems.append(f"stopping took {result['stop_s']} s (at most {STOP_TIMEOUT_S})")
    if "resumes from the newest" not in output:
        problems.append("train did not say what resumes the stopped run")
    result["stop_problems"] = problems
    if problems:
        print(output[-4000:], file=sys.stderr)
    return result


def primerl_variant(
    engine: str,
    grpo_image: str,
    version: str,
    clones_dir: str | None,
    keep: bool = False,
    python312: str | None = None,
) -> dict:
    """Build grpo's prime-rl variant from local clones and train it one step, or say in one line
    why not (ci/primerl_image.py). The variant is removed again unless ``keep``."""
    commits = primerl_image.pinned_commits()
    clones, why = primerl_image.find_clones(clones_dir, commits)
    if not clones and not clones_dir:
        print(f"ci/images.py: grpo-primerl skipped: {why}", file=sys.stderr, flush=True)
        return {"primerl_variant": f"skipped: {why}"}
    if not clones:  # asked for, but not usable: a failure, not a skip
        print(f"ci/images.py: grpo-primerl: {why}", file=sys.stderr, flush=True)
        return {"primerl_variant": "not built", "primerl_problems": [why]}
    tag, pinned = f"cortex/grpo-primerl:{version}", "cortex/grpo-primerl:pinned"
    result: dict = {"primerl_variant": tag}
    try:
        result["primerl_build_s"] = round(
            primerl_image.build_variant(engine, grpo_image, tag, clones, commits, run, python312),
            1,
        )
        run([engine, "tag", tag, pinned])
        result["primerl_size_mb"] = round(image_size(engine, tag) / 2**20)
        result.update(primerl_image.train_variant(engine, pinned))
        result["primerl_problems"] = []
    except subprocess.CalledProcessError as exc:
        result["primerl_problems"] = [describe_failure(exc)]
    except ValueError as exc:
        result["primerl_problems"] = [str(exc)]
    finally:
        if not keep:
            primerl_image.remove(engine, tag, pinned)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        nargs="?",
        choices=("build", "qualify"),
        default="build",
        help="build (default): build, smoke, remove; qualify: qualify in an image already built",
    )
    parser.add_argument("--engine", default="podman")
    parser.add_argument("--base", default=None, help="base image in place of the pinned one")
    parser.add_argument("--journey", action="append", help="only these journeys (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the images")
    parser.add_argument("--no-smoke", action="store_true")
    parser.add_argument(
        "--no-train",
        action="store_true",
        help="skip `train` with the default config to its first step (FIRST_STEP)",
    )
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="JOURNEY",
        help="after `train`, start it again and `<engine> stop` it once its backend is up: it "
        "must exit within 10 s, not be killed, and say what resumes it",
    )
    parser.add_argument(
        "--reproducible",
        action="store_true",
        help="build twice without the layer cache and compare image IDs",
    )
    parser.add_argument(
        "--qualify",
        action="append",
        default=[],
        metavar="JOURNEY[:PROFILE]",
        help="after the smoke, run qualify in this journey's image and check its record",
    )
    parser.add_argument(
        "--primerl-clones",
        default=os.environ.get(primerl_image.CLONES_ENV),
        metavar="DIR",
        help="with grpo: also build cortex/grpo-primerl from DIR/prime-rl and DIR/verifiers "
        f"(default ${primerl_image.CLONES_ENV}); without them, say why it was skipped",
    )
    parser.add_argument(
        "--primerl-python312",
        default=os.environ.get(primerl_image.PYTHON312_ENV),
        metavar="PREFIX",
        help="with --primerl-clones: a local CPython 3.12 install to put in the variant in place "
        f"of uv's download from GitHub (default ${primerl_image.PYTHON312_ENV})",
    )
    parser.add_argument("--profile", help="qualify: a profile name (default: the image picks)")
    parser.add_argument("--out", help="qualify: the directory mounted at /out")
    parser.add_argument(
        "--gpus",
        action="store_true",
        help="qualify: give the container the GPUs ($HF_CACHE, if set, is mounted at /hf-cache)",
    )
    args = parser.parse_args(argv)

    try:
        engine, note = pick_engine(args.engine)
    except EngineError as exc:
        print(f"ci/images.py: {exc}", file=sys.stderr)
        return 2
    if note:
        print(f"ci/images.py: {note}", file=sys.stderr)
    args.engine = engine
    journeys = landed_journeys()
    if args.journey:
        unknown = sorted(set(args.journey) - {j["name"] for j in journeys})
        if unknown:
            parser.error(f"unknown or not landed journeys {unknown}")
        journeys = [j for j in journeys if j["name"] in args.journey]
    qualify = dict(
        (spec.split(":", 1) + [None])[:2] for spec in args.qualify
    )  # journey -> profile or None
    unknown = sorted(set(qualify) - {j["name"] for j in journeys})
    if unknown:
        parser.error(f"--qualify names journeys that are not built here: {unknown}")
    unknown = sorted(set(args.stop) - {j["name"] for j in journeys})
    if unknown:
        parser.error(f"--stop names journeys that are not built here: {unknown}")
    if args.command == "qualify":
        failed = []
        for journey in journeys:
            result = {"journey": journey["name"]}
            result.update(
                qualify_image(
                    args.engine, journey["name"], f"cortex/{journey['name']}:pinned",
                    profile=args.profile, out=Path(args.out) if args.out else None,
                    gpus=args.gpus,
                )
            )  # fmt: skip
            if result["qualify_problems"]:
                failed.append(journey["name"])
            print(json.dumps(result), flush=True)
        return 1 if failed else 0
    failed = []
    try:
        shared = [] if args.reproducible else build_shared(args.engine, args.base)
    except subprocess.CalledProcessError as exc:
        print(f"ci/images.py: the shared stages: {describe_failure(exc)}", file=sys.stderr)
        return 1
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
            result["id"] = image_id(args.engine, tag)
            if args.reproducible:
                again = f"{tag}-again"
                build(args.engine, journey, args.base, again, no_cache=True)
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
            if not args.no_train:
                result.update(train_image(args.engine, journey["name"], pinned))
                if result["train_problems"]:
                    failed.append(journey["name"])
            if journey["name"] in args.stop:
                result.update(stop_image(args.engine, pinned))
                if result["stop_problems"]:
                    failed.append(journey["name"])
            if journey["name"] == "grpo":
                result.update(
                    primerl_variant(
                        args.engine,
                        pinned,
                        version,
                        args.primerl_clones,
                        keep=args.keep,
                        python312=args.primerl_python312,
                    )
                )
                if result.get("primerl_problems") or result.get("primerl_train_problems"):
                    failed.append("grpo-primerl")
            if journey["name"] in qualify:
                result.update(
                    qualify_image(
                        args.engine, journey["name"], pinned, profile=qualify[journey["name"]]
                    )
                )
                if result["qualify_problems"]:
                    failed.append(journey["name"])
        except (subprocess.CalledProcessError, ValueError) as exc:
            result["error"] = describe_failure(exc)
            print(f"ci/images.py: {journey['name']}: {result['error']}", file=sys.stderr)
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
    if shared and not args.keep:
        subprocess.run([args.engine, "rmi", "--force", *shared], check=False, capture_output=True)
        subprocess.run([args.engine, "image", "prune", "--force"], check=False, capture_output=True)
    if failed:
        print(f"failed: {sorted(set(failed))}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
