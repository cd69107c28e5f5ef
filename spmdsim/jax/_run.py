"""``spmdsim run [--executor threads|vectorized] [--trace PATH] SCRIPT.py [script args] [--devices N]``: run an
unmodified JAX script on virtual devices.

``jax.pmap`` becomes :func:`spmdsim.jax.pmap` (also for ``from jax import pmap``, which runs after the
replacement), and ``jax.device_count``, ``jax.local_device_count`` and ``jax.devices`` report the N virtual
devices. Everything else, the user's ``jax.jit`` included, stays real JAX.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys

import spmdsim
from spmdsim.jax._patch import patched_jax

def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """spmdsim's options (before the script, or a ``--devices N`` after it) and the script's own argv.
    Everything after ``--`` belongs to the script."""
    ours, script = [], []
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        ours.extend(argv[i:i + 2] if "=" not in argv[i] else argv[i:i + 1])
        i += 2 if "=" not in argv[i] else 1
    rest = argv[i:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    if rest:
        script.append(rest[0])
        tail = rest[1:]
        j = 0
        while j < len(tail):
            if tail[j] == "--":
                script.extend(tail[j + 1:])
                break
            if tail[j] == "--devices" and j + 1 < len(tail):
                ours.extend(tail[j:j + 2])
                j += 2
                continue
            if tail[j].startswith("--devices="):
                ours.append(tail[j])
                j += 1
                continue
            script.append(tail[j])
            j += 1
    return ours, script


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, script = split_argv(argv)
    parser = argparse.ArgumentParser(prog="spmdsim run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=spmdsim.device_count(),
                        help="number of virtual devices (default: SPMDSIM_NUM_DEVICES or 8)")
    parser.add_argument("--executor", choices=["threads", "vectorized"], default="threads",
                        help="threads (default: one thread per device, the reference) or vectorized (all devices "
                             "at once; for thousands of devices)")
    parser.add_argument("--trace", metavar="PATH", default=None,
                        help="record every collective and write a Perfetto/Chrome trace JSON to PATH")
    args = parser.parse_args(ours)
    if not script:
        parser.error("give the script to run: spmdsim run SCRIPT.py [script args] [--devices N]")
    print(f"spmdsim run: {script[0]} on {args.devices} virtual devices; replaced jax.pmap with spmdsim.jax.pmap "
          f"(values computed by NumPy, {args.executor} executor) and jax.device_count/local_device_count/devices "
          f"with the virtual devices; everything else is real JAX.", file=sys.stderr)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = script
    sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))  # as `python SCRIPT.py` does
    tracing = spmdsim.trace(values="summary") if args.trace else contextlib.nullcontext()
    try:
        with patched_jax(args.devices, args.executor), tracing as tr:
            try:
                runpy.run_path(script[0], run_name="__main__")
            finally:
                if args.trace:
                    tr.to_perfetto(args.trace)
                    print(f"spmdsim run: wrote {len(tr.events)} collectives to {args.trace} (open it in "
                          f"https://ui.perfetto.dev or chrome://tracing)", file=sys.stderr)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0
