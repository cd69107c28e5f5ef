"""``spmdsim run [options] SCRIPT.py [args]`` (or ``-m MODULE [args]``): run an unmodified JAX script on
virtual devices.

``jax.pmap`` becomes :func:`spmdsim.jax.pmap` (also for ``from jax import pmap``, which runs after the
replacement), and ``jax.device_count``, ``jax.local_device_count`` and ``jax.devices`` report the N virtual
devices. Everything else, the user's ``jax.jit`` included, stays real JAX. The command line is parsed by
:func:`spmdsim._script.split_argv`: ``--devices``, ``--executor`` and ``--trace`` are spmdsim's wherever they
stand before a ``--``.
"""
from __future__ import annotations

import contextlib
import sys

import spmdsim
from spmdsim._script import check_program, run_program, split_argv
from spmdsim.cli import ArgumentParser, UsageError, positive_int

VALUED = ("--devices", "--executor", "--trace")
TRACE_FORMATS = {".json": "a Perfetto/Chrome trace", ".svg": "a timeline picture"}


def parser() -> ArgumentParser:
    """The options of ``spmdsim run`` (the program and its arguments are split off first)."""
    p = ArgumentParser(
        prog="spmdsim run",
        usage="spmdsim run [options] SCRIPT.py [args]\n       spmdsim run [options] -m MODULE [args]",
        description="Run an unmodified JAX script on virtual devices: jax.pmap and jax.shard_map (and jitted "
                    "programs that contain them) are computed by spmdsim with NumPy; JAX's CPU platform gets the "
                    "virtual devices; everything else stays real JAX.",
        epilog="--devices, --executor and --trace are spmdsim's wherever they appear; arguments after -- all go "
               "to the script.")
    p.add_argument("--devices", type=positive_int, default=spmdsim.device_count(), metavar="N",
                   help="number of virtual devices (default: SPMDSIM_NUM_DEVICES or 8)")
    p.add_argument("--executor", choices=["threads", "vectorized"], default="threads",
                   help="threads (default: one thread per device, the reference) or vectorized (all devices at "
                        "once; for thousands of devices)")
    p.add_argument("--trace", metavar="PATH", default=None,
                   help="record every collective; PATH.json: a Perfetto trace (https://ui.perfetto.dev), "
                        "PATH.svg: a timeline picture")
    return p


def _trace_format(path: str | None) -> str | None:
    """``.json`` or ``.svg`` from ``--trace PATH``, checked before the script runs."""
    if path is None:
        return None
    for suffix in TRACE_FORMATS:
        if path.lower().endswith(suffix):
            return suffix
    raise UsageError(f"--trace {path}: expected a path ending in .json (a Perfetto trace) or .svg (a timeline "
                     f"picture)")


def main(argv: list[str] | None = None) -> int:
    """``spmdsim run``: returns the script's exit status.

    Raises:
        UsageError: bad options, no script, a script or module that does not exist, or jax not installed.
    """
    ours, program = split_argv(list(sys.argv[1:] if argv is None else argv), VALUED)
    args = parser().parse_args(ours)
    if program is None:
        raise UsageError("give the script to run: spmdsim run [options] SCRIPT.py [args], or -m MODULE [args]")
    trace_format = _trace_format(args.trace)
    check_program(program)
    from spmdsim.jax._patch import patched_jax

    print(f"spmdsim run: {program.name} on {args.devices} virtual devices; replaced jax.pmap with spmdsim.jax.pmap "
          f"and jax.shard_map with spmdsim's (values computed by NumPy, {args.executor} executor); JAX's CPU "
          f"devices are the virtual devices; everything else is real JAX.", file=sys.stderr)
    tracing = spmdsim.trace(values="summary") if trace_format else contextlib.nullcontext()
    with patched_jax(args.devices, args.executor), tracing as tr:
        try:
            return run_program(program)
        finally:
            if trace_format:
                _write_trace(tr, args.trace, trace_format)


def _write_trace(tr, path: str, trace_format: str) -> None:
    if trace_format == ".svg":
        if not tr.events and not tr.calls:
            print(f"spmdsim run: no mapped call ran, so no timeline was written to {path}", file=sys.stderr)
            return
        tr.to_svg(path)
        print(f"spmdsim run: drew {len(tr.events)} collectives as a timeline in {path}", file=sys.stderr)
    else:
        tr.to_perfetto(path)
        print(f"spmdsim run: wrote {len(tr.events)} collectives to {path} (open it in https://ui.perfetto.dev or "
              f"chrome://tracing)", file=sys.stderr)
