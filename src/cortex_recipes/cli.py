"""`cortex-recipes` command line (`list`, `models`, `serve`, `validate`, `report`, `qualify`, `journey`,
`export`, `catalog`, `--version`). Prints results to stdout; everything else goes to logging."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from cortex_recipes.export import ExportError
from cortex_recipes.journeys import JourneyError
from cortex_recipes.models import FIXTURE_MODELS, ModelNotAvailableError, resolve_model_path
from cortex_recipes.weights import WeightsError

log = logging.getLogger("cortex_recipes.cli")


def _cmd_models_path(args: argparse.Namespace) -> int:
    print(resolve_model_path(args.name))
    return 0


def _cmd_models_verify(args: argparse.Namespace) -> int:
    from cortex_recipes.weights import load_pins, verify

    root = _root(args)
    names = args.names or sorted(load_pins(root))
    problems = []
    for name in names:
        folder, found = verify(root, name)
        problems += found
        if not found:
            print(f"ok {name} {folder}")
    for problem in problems:
        print(problem)
    if problems:
        log.error("models verify: %d problem(s); nothing unverified is used", len(problems))
        return 1
    return 0


def _cmd_models_fetch(args: argparse.Namespace) -> int:
    from cortex_recipes.weights import fetch

    folder, problems = fetch(
        _root(args), args.name, pin=args.pin,
        local_dir=Path(args.local_dir) if args.local_dir else None,
    )  # fmt: skip
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"ok {args.name} {folder}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from cortex_recipes.local.server import run_from_args

    return run_from_args(args)


def _root(args: argparse.Namespace) -> Path:
    from cortex_recipes.journeys import find_root

    return Path(args.root).resolve() if args.root else find_root()


def _print_problems(problems: list[str], what: str) -> int:
    for problem in problems:
        print(problem)
    if problems:
        log.error("%s: %d problem(s)", what, len(problems))
        return 1
    log.info("%s: no problems", what)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from cortex_recipes.report import ReportError, check

    if args.html:
        from cortex_recipes.report_html import write_html

        print(write_html(_root(args), Path(args.html)))
        if not (args.check or args.write):
            return 0
    try:
        differences = check(_root(args), write=args.write)
    except ReportError as exc:
        print(exc)
        return 1
    for difference in differences:
        print(f"{'rewrote' if args.write else 'differs'}: {difference}")
    if differences and not args.write:
        log.error("report: %d number(s) in the docs differ from their records", len(differences))
        return 1
    log.info("report: every marked number matches its record")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from cortex_recipes.repo_checks.records import stale_evidence
    from cortex_recipes.validate import validate_repository

    root = _root(args)
    if args.restamp:
        from cortex_recipes.repo_checks.records import restamp

        for path in restamp(root):
            log.info("re-stamped %s with the form-blind code digest", path)
    problems = validate_repository(root)
    for problem in problems:
        print(problem)
    stale = stale_evidence(root)
    for line in stale:  # on stderr: stdout stays one line per contract problem
        (log.error if args.release else log.warning)("stale: %s", line)
    # One summary line that counts what was found (the stale records fail a release only).
    found = [f"{len(problems)} problem(s)"] if problems else []
    if stale:
        found.append(
            f"{len(stale)} evidence record(s) no longer describe the code"
            + ("" if args.release else " (a release, `validate --release`, fails on them)")
        )
    failed = bool(problems) or (args.release and bool(stale))
    if not found:
        log.info("validate: no problems")
    else:
        (log.error if failed else log.warning)("validate: %s", "; ".join(found))
    return 1 if failed else 0


def _cmd_catalog_validate(args: argparse.Namespace) -> int:
    from cortex_recipes.catalog import validate_catalog

    return _print_problems(validate_catalog(_root(args)), "catalog validate")


def _cmd_catalog_sync(args: argparse.Namespace) -> int:
    from cortex_recipes.catalog import sync

    for path in sync(_root(args)):
        print(f"updated {path}")
    return 0


def _cmd_qualify(args: argparse.Namespace) -> int:
    from cortex_recipes.qualify_command import qualify

    return qualify(
        _root(args), args.journey, args.profile, list(args.overrides), args.out, args.stale
    )


def _cmd_list(args: argparse.Namespace) -> int:
    from cortex_recipes.listing import journey_rows, render

    sys.stdout.write(render(journey_rows(_root(args)), wide=args.wide))
    return 0


def version() -> str:
    """This package's version and the SDK version it is qualified against."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        sdk = installed("cortex-training")
    except PackageNotFoundError:
        sdk = "not installed"
    return f"cortex-recipes {installed('cortex-recipes')} (cortex-training {sdk})"


def _cmd_journey(args: argparse.Namespace) -> int:
    root = _root(args)
    from cortex_recipes import journey_runner

    command = journey_runner.journey_command(root, args.verb, args.journey, args.overrides)
    log.info("running %s in %s", " ".join(command), root)
    resume = journey_runner.resume_command(sys.argv[1:])
    return journey_runner.run_stoppable(command, root, resume=resume)


def _cmd_export(args: argparse.Namespace) -> int:
    from cortex_recipes.export import export_checkpoint

    record = export_checkpoint(
        Path(args.run), Path(args.out), merge_lora=args.merge_lora, checkpoint_id=args.checkpoint
    )
    print(
        f"exported {record['kind']} ({record['checkpoint_id']}, step {record['global_steps']}) to {args.out}"
    )
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from cortex_recipes.plots import PlotError, plot_runs

    if args.out:
        out = Path(args.out)
    elif len(args.runs) == 1:
        out = Path(args.runs[0]) / "plots"
    else:
        print("error: --out is required with several run dirs (default: <run dir>/plots for one)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        written = plot_runs(args.runs, out)
    except PlotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0 if written else 1


ROOT_HELP = "repository root (default: the nearest directory holding journeys.toml)"
Argument = tuple[tuple[str, ...], dict[str, object]]


def _arg(*names: str, **options: object) -> Argument:
    """One ``add_argument`` call, as data for :func:`_add_command`."""
    return names, options


def _add_command(
    commands: argparse._SubParsersAction,
    name: str,
    func: Callable[[argparse.Namespace], int],
    help: str,
    *arguments: Argument,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand ``name`` with ``arguments`` (in order) that runs ``func``."""
    parser = commands.add_parser(name, help=help, description=description)
    for names, options in arguments:
        parser.add_argument(*names, **options)
    parser.set_defaults(func=func)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cortex-recipes")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument("--version", action="version", version=version())
    commands = parser.add_subparsers(dest="command", required=True)

    _add_command(
        commands, "list", _cmd_list,
        "each journey, its profiles, their hardware and validation status",
        _arg("--wide", action="store_true", help="also print each profile's purpose"),
        _arg("--root", help="repository root (default: the nearest journeys.toml)"),
        description="Read from journeys.toml and each journey's recipe.yaml; one line a profile.",
    )  # fmt: skip

    models = commands.add_parser("models", help="offline model fixtures and local hub models")
    model_commands = models.add_subparsers(dest="models_command", required=True)
    models_root = _arg("--root", help="repository root (default: the nearest with journeys.toml)")
    _add_command(
        model_commands, "path", _cmd_models_path,
        "print the local directory for a model name, building a fixture if needed",
        _arg("name"),
        description=f"Fixture names: {', '.join(FIXTURE_MODELS)}; hub names need local weights.",
    )  # fmt: skip
    _add_command(
        model_commands, "verify", _cmd_models_verify,
        "check local hub weights against the revision and sha256 pins in models.json",
        _arg("names", nargs="*", help="hub model names (e.g. Qwen/Qwen3-0.6B)"),
        models_root,
        description=(
            "Offline. Fails (exit 1) on an unfilled pin, a missing file or a hash mismatch, "
            "each with the command that fixes it. Default: every hub model in the catalog."
        ),
    )  # fmt: skip
    _add_command(
        model_commands, "fetch", _cmd_models_fetch,
        "download a hub model at its pinned revision (networked machines only), then verify",
        _arg("name"),
        _arg("--pin", action="store_true", help="fill the pin from what is downloaded"),
        _arg("--local-dir", help="a CORTEX_RECIPES_MODEL_DIRS folder instead of the cache"),
        models_root,
        description=(
            "Uses huggingface_hub.snapshot_download with the pinned revision, into the Hugging "
            "Face cache (HF_HUB_CACHE / HF_HOME) or --local-dir/<org>/<name> (a "
            "CORTEX_RECIPES_MODEL_DIRS entry). --pin writes the revision and the weight "
            "hashes it got into model-catalog/models.json (for a maintainer to commit)."
        ),
    )  # fmt: skip

    from cortex_recipes.local.server import add_serve_arguments

    serve = _add_command(
        commands, "serve", _cmd_serve, "run the local Cortex Training-compatible backend"
    )
    add_serve_arguments(serve)

    root = _arg("--root", help=ROOT_HELP)
    problems = "Prints one 'path: problem' line per problem; exits 1 if there is any."
    _add_command(
        commands, "validate", _cmd_validate,
        "check every landed journey against the recipe contract (offline, no models)",
        root,
        _arg("--release", action="store_true",
             help="also fail on stale evidence: a record behind last_validated whose code_digest "
             "or git_revision no longer matches the code"),
        _arg("--restamp", action="store_true",
             help="first give records with a byte digest of exactly today's code the "
             "form-blind digest (no re-run)"),
        description=problems,
    )  # fmt: skip
    _add_command(
        commands, "report", _cmd_report,
        "check (or --write) the numbers the docs quote from evidence records",
        root,
        _arg("--check", action="store_true", help="the default: fail on any difference"),
        _arg("--write", action="store_true", help="rewrite every marked number from its record"),
        _arg("--html", metavar="DIR",
             help="write a static release report, DIR/index.html, with the plots and records it "
             "links copied beside it (cortex_recipes.report_html); checks nothing unless "
             "--check or --write is given too"),
        description="Numbers between <!-- record PATH FIELD [FORMAT] --> and <!-- /record --> "
        "markers in the repository's Markdown files are rendered from the records they name "
        "(cortex_recipes.report). Prints one line per difference; exits 1 if any.",
    )  # fmt: skip
    _add_command(
        commands, "qualify", _cmd_qualify,
        "run a journey's qualification for one profile and record the evidence",
        _arg("journey", nargs="?", help="a journey name from journeys.toml (e.g. sft)"),
        _arg("profile", nargs="?", default="auto",
             help="a profile name from the journey's recipe.yaml; auto (default): the GPU profile "
             "when CUDA is visible and its pinned weights verify, else the CPU qualification profile"),
        _arg("overrides", nargs="*", help="key=value overrides passed on (e.g. connection=...)"),
        _arg("--stale", action="store_true",
             help="re-run exactly the qualifications whose evidence `validate` reports as stale"),
        root,
        _arg("--out",
             help="write the runs to OUT/runs and the record to OUT/evidence, and leave recipe.yaml "
             "and the catalog alone (the image's /out)"),
        description=(
            "Runs `python -m <qualify module> profile=<config> [overrides]` from journeys.toml; "
            "on success the module has written evidence/<profile>.json and set last_validated, "
            "and the model catalog and recipes/README.md are regenerated."
        ),
    )  # fmt: skip
    _add_command(
        commands, "journey", _cmd_journey,
        "run a journey's default training or its smoke command (the image verbs)",
        _arg("verb", choices=("train", "smoke")),
        _arg("journey", help="a journey name from journeys.toml (e.g. sft)"),
        _arg("overrides", nargs="*", help="key=value overrides passed on"),
        root,
        description=(
            "train: python -m <entry point> [overrides], with connection=<file> added when "
            "$CORTEX_CONNECTION_FILE is set or /run/cortex/connection.json exists, and the "
            "journey's GPU profile when a GPU is visible and its weights verify; "
            "smoke: the smoke command from journeys.toml. The exit code is the command's; "
            "SIGTERM or SIGINT stops it within 6 s (exit 128 + the signal)."
        ),
    )  # fmt: skip
    _add_command(
        commands, "export", _cmd_export,
        "write a run's checkpoint as a directory from_pretrained (or PEFT) loads",
        _arg("run", help="a run folder (runs/<journey>/<run name>) or a checkpoint dir"),
        _arg("out", help="a new (or empty) output directory"),
        _arg("--merge-lora", action="store_true", help="fold a LoRA adapter in"),
        _arg("--checkpoint", help="a checkpoint_id from the run's checkpoints.jsonl"),
        description=(
            "RUN is a run folder (its newest checkpoint, or --checkpoint) or a checkpoint "
            "directory (.../cp_<id>/global_step<N>/). Full weights become a Hugging Face model "
            "directory, a LoRA adapter a PEFT directory (or, with --merge-lora, a merged model)."
        ),
    )  # fmt: skip
    _add_command(
        commands, "plot", _cmd_plot,
        "write PNGs of loss, reward, teacher KL, policy lag and eval curves of runs",
        _arg("runs", nargs="+", metavar="RUN", help="a run folder (runs/<journey>/<run>)"),
        _arg("--out", help="output folder (default with one run: <run>/plots)"),
        description=(
            "Reads each RUN's metrics.jsonl and writes one PNG per curve some run reports "
            "(loss, reward, teacher_kl, mismatch_kl, policy_lag, eval), the runs overlaid; "
            "prints the paths written. Exits 1 if no run reports a plotted key."
        ),
    )  # fmt: skip

    catalog = commands.add_parser("catalog", help="the model catalog (model-catalog/)")
    catalog_commands = catalog.add_subparsers(dest="catalog_command", required=True)
    _add_command(
        catalog_commands, "validate", _cmd_catalog_validate,
        "check schema, paths, SDK sub-jobs and evidence of every catalog entry",
        root,
        description=problems,
    )  # fmt: skip
    _add_command(
        catalog_commands, "sync", _cmd_catalog_sync,
        "regenerate catalog profiles, recipes/README.md and the compatibility table",
        root,
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ModelNotAvailableError, JourneyError, ExportError, WeightsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
