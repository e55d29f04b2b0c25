"""`cortex-recipes` command line. Prints results to stdout; everything else goes to logging."""

from __future__ import annotations

import argparse
import logging
import sys

from cortex_recipes.models import FIXTURE_MODELS, ModelNotAvailableError, resolve_model_path


def _cmd_models_path(args: argparse.Namespace) -> int:
    print(resolve_model_path(args.name))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from cortex_recipes.local.server import run_from_args

    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cortex-recipes")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)

    models = commands.add_parser("models", help="offline model fixtures and local hub models")
    model_commands = models.add_subparsers(dest="models_command", required=True)
    path = model_commands.add_parser(
        "path",
        help="print the local directory for a model name, building a fixture if needed",
        description=f"Fixture names: {', '.join(FIXTURE_MODELS)}; hub names need local weights.",
    )
    path.add_argument("name")
    path.set_defaults(func=_cmd_models_path)

    from cortex_recipes.local.server import add_serve_arguments

    serve = commands.add_parser("serve", help="run the local Cortex Training-compatible backend")
    add_serve_arguments(serve)
    serve.set_defaults(func=_cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except ModelNotAvailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
