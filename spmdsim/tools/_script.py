"""Running a user's program as ``python SCRIPT.py`` or ``python -m MODULE`` would, for ``spmdsim run`` and
``spmdsim debug``. Imports no jax.

The command line of both commands is ``spmdsim CMD [options] SCRIPT.py [args]`` or ``spmdsim CMD [options] -m
MODULE [args]``. spmdsim's options stand before the program; those that take a value (``--devices N``,
``--trace PATH``, ...) are also taken after it, up to a ``--``; every other argument after the program, and
everything after ``--``, is the program's.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import io
import os
import pkgutil
import runpy
import sys
import traceback
import types
from typing import Collection

from spmdsim.cli import UsageError
from spmdsim.runtime._stack import run_deep

__all__ = ["Program", "split_argv", "run_program"]


@dataclasses.dataclass(frozen=True)
class Program:
    """A program to run: a script ``path`` or a ``module`` name (exactly one is set), and its arguments
    (``sys.argv[1:]`` as the program sees it)."""

    path: str | None
    module: str | None
    args: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``prog.py`` or ``-m package.module``, as typed."""
        return self.path if self.path is not None else f"-m {self.module}"


def split_argv(argv: list[str], valued: Collection[str]) -> tuple[list[str], Program | None]:
    """Separate spmdsim's options from the program and the program's arguments.

    Args:
        argv: the arguments after ``spmdsim CMD``.
        valued: spmdsim's options that take a value (e.g. ``{"--devices", "--trace"}``); these are taken
            after the program too (as ``--devices 4`` or ``--devices=4``) until a ``--``.

    Returns:
        spmdsim's options (for argparse) and the :class:`Program`, or None when no program was named.

    Raises:
        UsageError: ``-m`` without a module name.
    """
    ours: list[str] = []
    i, program_at = 0, None
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            module = arg[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
            if not module:
                raise UsageError("-m needs a module name: -m package.module [args]")
            return ours, _after(Program(None, module), argv[i + (1 if arg[2:] else 2):], valued, ours)
        if not arg.startswith("-") or arg == "-":
            break
        ours.append(arg)
        i += 1
        if arg in valued and i < len(argv):
            ours.append(argv[i])
            i += 1
    if i < len(argv):
        program_at = i
    if program_at is None:
        return ours, None
    return ours, _after(Program(argv[program_at], None), argv[program_at + 1:], valued, ours)


def _after(program: Program, rest: list[str], valued: Collection[str], ours: list[str]) -> Program:
    """The program with its arguments, taking spmdsim's valued options out of ``rest`` (until ``--``)."""
    args: list[str] = []
    j = 0
    while j < len(rest):
        arg = rest[j]
        if arg == "--":
            args.extend(rest[j + 1:])
            break
        if arg in valued and j + 1 < len(rest):
            ours.extend(rest[j:j + 2])
            j += 2
            continue
        if arg.split("=", 1)[0] in valued and "=" in arg:
            ours.append(arg)
        else:
            args.append(arg)
        j += 1
    return dataclasses.replace(program, args=tuple(args))


def check_program(program: Program) -> str:
    """The file that ``program`` will run (checked before anything starts).

    Raises:
        UsageError: no such script (or folder with ``__main__.py``), or no such module.
    """
    if program.path is not None:
        path = program.path
        if os.path.isfile(path) or os.path.isfile(os.path.join(path, "__main__.py")):
            return path
        hint = ""
        if not path.endswith(".py") and not os.path.exists(path):
            hint = f"; to run a module, write -m {path}"
        raise UsageError(f"no such script: {path!r} (looked in {os.getcwd()}){hint}")
    sys.path.insert(0, os.getcwd())  # as `python -m` does
    try:
        spec = importlib.util.find_spec(program.module)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path.pop(0)
    if spec is None or spec.origin is None:
        raise UsageError(f"no module named {program.module!r} (searched the current folder and sys.path)")
    return spec.origin


def run_program(program: Program, *, shown: Collection[BaseException] = ()) -> int:
    """Run ``program`` in this process as ``__main__`` and return its exit status.

    ``sys.argv`` and ``sys.path`` are set as ``python SCRIPT.py`` / ``python -m MODULE`` sets them, and
    restored afterwards. A script's ``__file__`` and its code's file names are absolute, as Python (3.9 and
    later) makes them, and ``sys.argv[0]`` is as typed (see :func:`_run_script`). ``SystemExit`` becomes the
    returned status. An exception from the program is printed as Python prints it, without the runner's own
    frames above the program, and gives status 1.
    An error in ``shown`` (its report was already printed, e.g. by the debugger) gets its traceback and only
    the first line of its message. BaseExceptions that are not ``Exception`` (KeyboardInterrupt, the
    debugger's quit) propagate.

    Raises:
        UsageError: the script or module does not exist (see :func:`check_program`).
    """
    origin = check_program(program)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [origin if program.module else program.path, *program.args]
    try:
        if program.module:
            sys.path.insert(0, os.getcwd())
            run_deep(functools.partial(runpy.run_module, program.module, run_name="__main__", alter_sys=True))
        elif pkgutil.get_importer(os.path.abspath(program.path)) is not None:
            # a folder (or zip file) with __main__.py: runpy puts it first on sys.path, as python does
            run_deep(functools.partial(runpy.run_path, os.path.abspath(program.path), run_name="__main__"))
        else:
            sys.path.insert(0, os.path.dirname(os.path.realpath(program.path)))
            run_deep(_run_script, os.path.join(os.getcwd(), program.path))  # absolute as Python makes it
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits with 1
        return 1
    except Exception as e:  # noqa: BLE001 - printed as Python would, then an exit status
        _print_from_program(e, origin, brief=any(e is s for s in shown))
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def _run_script(path: str) -> None:
    """Run the script at ``path`` (absolute) as ``__main__``, as ``python SCRIPT.py`` does: compiled with that
    file name (so tracebacks and JAX's messages name it whole), in a new ``__main__`` module (``__file__`` the
    path, ``__loader__`` a file loader, ``__spec__``, ``__package__`` and ``__cached__`` None) that is
    ``sys.modules["__main__"]`` while it runs. ``runpy.run_path`` would also set ``sys.argv[0]`` to the path,
    which Python leaves as typed. A compiled ``.pyc`` runs as such."""
    import builtins
    from importlib.machinery import SourceFileLoader, SourcelessFileLoader
    with io.open_code(path) as f:
        code = pkgutil.read_code(f)
    loader = SourceFileLoader if code is None else SourcelessFileLoader
    if code is None:
        with io.open_code(path) as f:
            code = compile(f.read(), path, "exec")
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __cached__=None, __loader__=loader("__main__", path), __package__=None,
                           __spec__=None, __builtins__=builtins)  # the module, as in python's __main__
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is None:
            sys.modules.pop("__main__", None)
        else:
            sys.modules["__main__"] = saved


def _print_from_program(error: BaseException, origin: str, brief: bool = False) -> None:
    """Print ``error``'s traceback starting at the program's own first frame (the runner's frames and
    runpy's above it are dropped; the whole traceback when the program's file is not in it). ``brief``: the
    message's first line only."""
    tb, target = error.__traceback__, os.path.abspath(origin)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    if not brief:
        traceback.print_exception(type(error), error, tb or error.__traceback__, file=sys.stderr)
        return
    lines = traceback.format_list(traceback.extract_tb(tb or error.__traceback__))
    first = str(error).split("\n", 1)[0]
    sys.stderr.write("Traceback (most recent call last):\n" + "".join(lines)
                     + f"{type(error).__module__}.{type(error).__name__}: {first} (the full report is above)\n")
