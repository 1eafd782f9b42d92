"""The `ninfer` command: one entry point, one module per subcommand.

Each command module exposes `add_parser(subparsers)` (registering its flags) and `run(args) -> int`.
Errors reach the user as one line on stderr and a non-zero exit code; `--debug` shows tracebacks.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# NOTE: a literal list; each module is imported only when its command runs (fast --help).
COMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("ninfer.gateway.cli.cmd_convert", "convert a Hugging Face checkpoint into a .ninfer artifact"),
    "identities": ("ninfer.gateway.cli.cmd_identities", "list the registered model identities and their dimensions"),
    "inspect": ("ninfer.gateway.cli.cmd_inspect", "show (and optionally verify) a .ninfer artifact"),
    "generate": ("ninfer.gateway.cli.cmd_generate", "generate text from a prompt"),
    "chat": ("ninfer.gateway.cli.cmd_chat", "interactive terminal chat"),
    "serve": ("ninfer.gateway.cli.cmd_serve", "OpenAI-compatible HTTP server"),
    "score": ("ninfer.gateway.cli.cmd_score", "score texts: log-likelihood and perplexity"),
    "bench": ("ninfer.gateway.cli.cmd_bench", "benchmarks"),
}


class CLIError(Exception):
    """A user-facing error: printed as one line, exit code `code`."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def version_line() -> str:
    """`ninfer X.Y.Z (torch A.B.C, Python D.E.F)`, without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    from ninfer import __version__
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return f"ninfer {__version__} (torch {torch_version}, Python {sys.version.split()[0]})"


def _available() -> dict[str, tuple[str, str]]:
    out = {}
    for name, (mod, help_) in COMMANDS.items():
        if importlib.util.find_spec(mod) is not None:
            out[name] = (mod, help_)
    return out


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="ninfer", description="NInfer: Qwen3.6 inference engine")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print the version (and torch's and Python's) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, (mod_name, help_) in _available().items():
        mod = importlib.import_module(mod_name)
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks on errors")
        mod.add_parser(p)
        modules[name] = mod
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        print("ninfer: interrupted", file=sys.stderr)
        return 130
    except CLIError as e:
        if args.debug:
            raise
        print(f"ninfer {args.command}: error: {e}", file=sys.stderr)
        return e.code
    except Exception as e:  # noqa: BLE001 - the CLI boundary turns any failure into one line
        if args.debug:
            raise
        print(f"ninfer {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
