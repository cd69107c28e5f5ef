"""The ``spmdsim`` command: ``demo``, ``run``, ``debug``, ``conformance``, ``compare``.

Each subcommand is a module with ``main(argv) -> int``, imported only when it runs (``run`` imports jax,
the others do not). A mistake on the command line ends in one line, ``spmdsim CMD: error: ...``, and exit
status 2; subcommands report theirs by raising :class:`UsageError`.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import sys

__all__ = ["main", "UsageError", "ArgumentParser", "positive_int"]

COMMANDS = {
    "demo": ("spmdsim.demo", "data-parallel linear regression on the diabetes table, on virtual devices"),
    "run": ("spmdsim.jax.tools._run", "run an unmodified JAX script with jax.pmap on virtual devices (needs jax)"),
    "debug": ("spmdsim.debug", "step through a program's collectives: breakpoints, values, every device side by side"),
    "conformance": ("spmdsim.conformance", "compare spmdsim with the installed jax.pmap; print and write a matrix"),
    "compare": ("spmdsim.jax.tools._compare", "find where a JAX script's values leave XLA:CPU's, equation by equation"),
}

HOSTED = ("run", "compare")  # the commands with --hosts H (see spmdsim.tools._launch.before_import)

USAGE = """usage: spmdsim COMMAND [options]
       spmdsim --version

commands:
{commands}

'spmdsim COMMAND --help' explains a command's options."""


class UsageError(Exception):
    """A mistake on the command line. The command prints ``spmdsim CMD: error: MESSAGE`` (no traceback) and
    exits with status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but a parsing error raises :class:`UsageError` instead of printing the usage and
    exiting, so that every mistake reads the same one-line way."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UsageError(f"{message} (see {self.prog} --help)")


def positive_int(text: str) -> int:
    """argparse type: an int of at least 1 (a device or step count)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_device_options(parser: argparse.ArgumentParser, *, devices_default: int | None = None,
                       executor_help: str | None = None) -> None:
    """``--devices N`` (default ``devices_default``; None: the program's own count, SPMDSIM_NUM_DEVICES or 8, as
    the help says) and, when ``executor_help`` is given, ``--executor threads|vectorized``: the options every
    command that runs a program on virtual devices shares (run, compare, debug)."""
    parser.add_argument("--devices", type=positive_int, default=devices_default, metavar="N",
                        help="number of virtual devices (default: SPMDSIM_NUM_DEVICES or 8)")
    if executor_help is not None:
        parser.add_argument("--executor", choices=["threads", "vectorized"], default="threads", help=executor_help)


def main(argv: list[str] | None = None) -> int:
    """Run ``spmdsim ARGV``; returns the exit status.

    Args:
        argv: the arguments after ``spmdsim`` (default ``sys.argv[1:]``).

    Returns:
        0 on success, 2 for a command-line mistake, otherwise the subcommand's status.
    """
    from spmdsim import __version__

    argv = list(sys.argv[1:] if argv is None else argv)
    usage = USAGE.format(commands="\n".join(f"  {name:12s} {text}" for name, (_, text) in COMMANDS.items()))
    if not argv or argv[0] in ("-h", "--help"):
        print(usage, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"spmdsim {__version__}")
        return 0
    command = argv[0]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"spmdsim: error: unknown command {command!r}{hint}; the commands are {', '.join(COMMANDS)} "
              f"(spmdsim --help describes them).", file=sys.stderr)
        return 2
    try:
        if command in HOSTED:  # a multi-host job's launcher, and the parent of each host, need no JAX
            status = importlib.import_module("spmdsim.tools._launch").before_import(command, argv[1:])
            if status is not None:
                return status
        module = importlib.import_module(COMMANDS[command][0])
    except (ImportError, UsageError) as e:  # spmdsim run without jax, or a launcher's mistake
        print(f"spmdsim {command}: error: {e}", file=sys.stderr)
        return 2
    try:
        return module.main(argv[1:])
    except UsageError as e:
        print(f"spmdsim {command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
