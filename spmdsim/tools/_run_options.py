"""``spmdsim run``'s command line, read and checked without importing JAX.

The launcher of ``spmdsim run --hosts H`` reads it here, checks it and starts the hosts (:mod:`._launch`) without
importing JAX (about a second of CPU per process); ``spmdsim run`` itself (:mod:`spmdsim.jax.tools._run`) reads it
the same way. The command line is split by :func:`spmdsim.tools._script.split_argv`: ``--devices``,
``--executor``, ``--trace``, ``--hosts``, ``--hardware`` and ``--eager-shard-map`` are spmdsim's wherever they
stand before a ``--``.
"""
from __future__ import annotations

import dataclasses

import spmdsim
from spmdsim.cli import ArgumentParser, UsageError, add_device_options, positive_int
from spmdsim.tools._script import Program, check_program, split_argv

__all__ = ["VALUED", "TRACE_FORMATS", "RunOptions", "parser", "read"]

VALUED = ("--devices", "--executor", "--trace", "--hosts", "--hardware", "--eager-shard-map")
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
    add_device_options(p, devices_default=spmdsim.device_count(),
                       executor_help="threads (default: one thread per device, the reference) or vectorized (all "
                                     "devices at once; for thousands of devices)")
    p.add_argument("--eager-shard-map", choices=["once", "per-device"], default="once",
                   help="how an un-jitted jax.shard_map runs its body: once per call, on values holding every "
                        "device's block, as JAX does (default), or once per device, each in its own thread "
                        "(each device prints its own block, labelled; breakpoint() stops in one device)")
    p.add_argument("--trace", metavar="PATH", default=None,
                   help="record every collective; PATH.json: a Perfetto trace (https://ui.perfetto.dev), "
                        "PATH.svg: a timeline picture")
    p.add_argument("--hosts", type=positive_int, default=None, metavar="H",
                   help="a multi-host job: H host processes (started through mpiexec; needs the mpi extra), each "
                        "with N/H of the N devices; jax.process_index() tells them apart")
    p.add_argument("--hardware", metavar="CHIP:SHAPE", default=None,
                   help="predict each mapped call's time on real chips (tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, a100, "
                        "h100, b200, or FILE.json), e.g. tpu-v5e:2x4 or h100:8; prints a table per map at the end "
                        "and adds a predicted track to a --trace .json (see docs/cost_model.md)")
    return p


@dataclasses.dataclass
class RunOptions:
    """``spmdsim run``'s command line, checked: ``args`` (the parsed options), the ``program`` to run, the
    ``trace_format`` of ``--trace`` (``.json``, ``.svg`` or None) and the cost model's ``predictor`` for
    ``--hardware`` (None without it)."""

    args: object
    program: Program
    trace_format: str | None
    predictor: object

    def host_argv(self) -> list[str]:
        """The command line of each host process: these options, the program, ``--``, its arguments."""
        args, program = self.args, self.program
        argv = ["run", "--devices", str(args.devices), "--executor", args.executor, "--eager-shard-map",
                args.eager_shard_map]
        if args.trace:
            argv += ["--trace", args.trace]
        if args.hardware:
            argv += ["--hardware", args.hardware]
        argv += [program.path] if program.path is not None else ["-m", program.module]
        return argv + ["--", *program.args]


def read(raw: list[str]) -> RunOptions:
    """``spmdsim run``'s options and program from its arguments ``raw``, checked before anything runs.

    Raises:
        UsageError: bad options, no script, a script or module that does not exist, a bad ``--trace`` path or
            ``--hardware`` description.
    """
    ours, program = split_argv(raw, VALUED)
    args = parser().parse_args(ours)
    if program is None:
        raise UsageError("give the script to run: spmdsim run [options] SCRIPT.py [args], or -m MODULE [args]")
    trace_format = _trace_format(args.trace)
    check_program(program)
    return RunOptions(args, program, trace_format, _predictor(args.hardware, args.devices))


def _trace_format(path: str | None) -> str | None:
    """``.json`` or ``.svg`` from ``--trace PATH``, checked before the script runs."""
    if path is None:
        return None
    for suffix in TRACE_FORMATS:
        if path.lower().endswith(suffix):
            return suffix
    raise UsageError(f"--trace {path}: expected a path ending in .json (a Perfetto trace) or .svg (a timeline "
                     f"picture)")


def _predictor(hardware: str | None, devices: int):
    """The cost model's :class:`spmdsim.cost.Predictor` for ``--hardware`` (None without it: nothing is
    imported or installed), checked before the script runs."""
    if hardware is None:
        return None
    from spmdsim.cost import Predictor
    try:
        return Predictor(hardware, devices)
    except (ValueError, OSError) as e:
        raise UsageError(str(e) if str(e).startswith("--hardware") else f"--hardware {hardware}: {e}") from None
