"""``spmdsim run [options] SCRIPT.py [args]`` (or ``-m MODULE [args]``): run an unmodified JAX script on
virtual devices.

``jax.pmap`` becomes :func:`spmdsim.jax.pmap` (also for ``from jax import pmap``, which runs after the
replacement), and ``jax.device_count``, ``jax.local_device_count`` and ``jax.devices`` report the N virtual
devices. Everything else, the user's ``jax.jit`` included, stays real JAX. The command line is parsed by
:func:`spmdsim.tools._script.split_argv`: ``--devices``, ``--executor`` and ``--trace`` are spmdsim's wherever they
stand before a ``--`` (:mod:`spmdsim.tools._run_options`, which the launcher of ``--hosts H`` reads without JAX).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Callable

import spmdsim
from spmdsim.runtime import _threads
from spmdsim import hosts
from spmdsim.runtime._output import StandInStream
from spmdsim.tools import _run_options
from spmdsim.tools._script import run_program
from spmdsim.cli import UsageError


def main(argv: list[str] | None = None) -> int:
    """``spmdsim run``: returns the script's exit status.

    Raises:
        UsageError: bad options, no script, a script or module that does not exist, or jax not installed.
    """
    raw = list(sys.argv[1:] if argv is None else argv)
    options = _run_options.read(raw)
    args, program, trace_format, predictor = options.args, options.program, options.trace_format, options.predictor

    host = host_of(args, options.host_argv)
    if isinstance(host, int):  # this process launched the hosts: done
        return host
    from spmdsim.jax.integration._patch import patched_jax

    _threads.keep_freed_memory()  # this process is spmdsim's: freed memory kept for reuse (see spmdsim.runtime._threads)

    if host is None or host.index == 0:
        as_hosts = "" if host is None else \
            f" as {host.count} hosts ({host.local} device{'s' if host.local > 1 else ''} each, through MPI)"
        print(f"spmdsim run: {program.name} on {args.devices} virtual devices{as_hosts}; replaced jax.pmap with "
              f"spmdsim.jax.pmap and jax.shard_map with spmdsim's (values computed by NumPy, {args.executor} "
              f"executor); JAX's CPU devices are the virtual devices; everything else is real JAX.", file=sys.stderr)
    tracing = spmdsim.trace(values="summary") if trace_format else contextlib.nullcontext()
    predicting = predictor if predictor is not None and (host is None or host.index == 0) else contextlib.nullcontext()
    status = 1
    try:
        with patched_jax(args.devices, args.executor, host, args.eager_shard_map), tracing as tr, predicting:
            try:
                status = run_program(program)
            finally:
                if predictor is not None and (host is None or host.index == 0):
                    predictor.report(file=sys.stderr)
                if trace_format and (host is None or host.index == 0):  # host 0 has every host's events
                    _write_trace(tr, args.trace, trace_format)
                    if predictor is not None and trace_format == ".json":
                        predictor.add_to_perfetto(args.trace, tr)
                        print(f"spmdsim run: added the track 'predicted on {predictor.topology.label}' to "
                              f"{args.trace}", file=sys.stderr)
    finally:
        if host is not None:
            hosts.mpi.exit_process(host, "returned" if status == 0 else f"exited with status {status}")
    if args.devices >= QUICK_EXIT_DEVICES:
        _quick_exit(status)
    return status


# JAX's CPU client keeps threads per device and joins them when it is freed at interpreter exit: about 6 s with
# 4096 devices, minutes with 16384. From this many virtual devices on, spmdsim run ends the process itself.
QUICK_EXIT_DEVICES = 1024


def _quick_exit(status: int) -> None:
    """End the process with ``status`` after the program's ``atexit`` functions and a flush of the standard
    streams, without freeing JAX's CPU client (see ``QUICK_EXIT_DEVICES``)."""
    import atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


class HostLines(StandInStream):
    """A host's ``sys.stdout`` or ``sys.stderr`` under ``--hosts H``: each line it writes starts with ``host h | ``
    (as a device's lines start with ``device k [...] | ``) and goes out whole, at once (``mpiexec`` forwards each
    host's writes as they come, so a line written in pieces would be cut by another host's). What the program
    prints on every host thus appears once per host, each copy saying whose it is. (MPICH's ``-prepend-pattern``
    labels each chunk ``mpiexec`` reads, not each line.)"""

    def __init__(self, stream, host: int):
        self.stream, self.label = stream, f"host {host} | "
        self._partial = ""
        self._lock = threading.RLock()  # a signal handler that prints may interrupt a write

    def isatty(self) -> bool:
        return self.stream.isatty()

    def write(self, text: str) -> int:
        with self._lock:
            *whole, self._partial = (self._partial + text).split("\n")
            if whole:
                self.stream.write("".join(f"{self.label}{line}\n" for line in whole))
                self.stream.flush()
        return len(text)

    def flush(self) -> None:
        """Lines go out as they end; an unfinished one waits for its end (or for :meth:`close`)."""
        with self._lock:
            if not self.stream.closed:
                self.stream.flush()

    def close(self) -> None:
        with self._lock:
            if self._partial and not self.stream.closed:
                self.stream.write(f"{self.label}{self._partial}\n")
                self.stream.flush()
            self._partial = ""


def _label_host_lines(host: int) -> None:
    """Label every line this host process writes to its stdout and stderr (see :class:`HostLines`); at exit the
    last unfinished line goes out too."""
    import atexit
    for name in ("stdout", "stderr"):
        stream = HostLines(getattr(sys, name), host)
        setattr(sys, name, stream)
        atexit.register(stream.close)


def host_of(args, host_argv: Callable[[], list[str]]):
    """Where this process stands in ``spmdsim COMMAND [--hosts H] ...`` (``args.devices``, ``args.hosts``):
    the :class:`spmdsim.hosts.Host` it is when MPI started it (mpiexec, or ``--hosts H`` launching it: the host
    itself, the child of the process mpiexec started, see :func:`spmdsim.tools._launch.before_import`), None for a
    single process, or an exit status where it launched the H hosts (``host_argv()``: their command line) and is
    done.

    Raises:
        UsageError: the devices do not split over the hosts, or ``--hosts`` disagrees with mpiexec's count.
    """
    if hosts.launched_by_mpi():
        try:
            host = hosts.mpi_host(args.devices)
        except ValueError as e:  # the devices do not split over the processes mpiexec started
            raise UsageError(f"--devices {args.devices}: {e}") from None
        if args.hosts not in (None, host.count):
            raise UsageError(f"--hosts {args.hosts}, but mpiexec started {host.count} processes")
        _label_host_lines(host.index)
        return host
    if args.hosts is not None and args.hosts > 1:
        from spmdsim.tools import _launch
        return _launch.launch_hosts(args.hosts, args.devices, host_argv())
    return None


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
