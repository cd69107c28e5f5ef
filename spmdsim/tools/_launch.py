"""``spmdsim run --hosts H``: start H host processes through ``mpiexec`` (MPICH's, from the ``mpich`` wheel:
``python -m pip install "spmdsim[mpi]"``), each running ``python -m spmdsim run`` as one host.

``mpiexec`` runs with ``-disable-auto-cleanup``: when a host dies, the others are not killed by MPICH
(whose report names the wrong process) but end by themselves within seconds with a
:class:`~spmdsim.errors.HostLostError` naming the host. MPICH's process manager kills every process of the job
when one of *its* processes dies of a signal, even then; so each host runs in a child of the process that
``mpiexec`` started (:func:`run_as_host_child`), which only waits for it and exits normally with its status.
It runs in its own session, so that one Ctrl-C reaches
it exactly once (from here; it passes Ctrl-C on to every host); it gets SIGINT if this launcher dies. A second
Ctrl-C, or hosts still running ``STOP_SECONDS`` after the first, make ``mpiexec`` abort them.

**Loopback only** (one machine): UCX may use only the loopback device (``UCX_NET_DEVICES=lo``; shared memory
between the hosts) and MPICH's launcher advertises the loopback address (``-iface lo``). MPICH's launcher still
listens on every address (its control port binds the wildcard, whatever ``-iface`` says), so where the system
lets an unprivileged user make namespaces, the job runs in a network namespace of its own whose only device is
loopback (``unshare --user --map-current-user --net``, loopback brought up): nothing of the job can be reached
from outside it, by another user of the machine included. Settings given in the environment win
(``SPMDSIM_PRIVATE_NETWORK=0`` keeps the machine's namespace).

**No JAX where none is needed** (:func:`before_import`): the launcher and the process ``mpiexec`` starts for each
host only start and wait for other processes; they do it before ``spmdsim run``'s module, and with it JAX, is
imported (about 1.3 s of CPU each: a 4-host job started 5 such imports beside the 4 its hosts need).
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys

from spmdsim.cli import UsageError
from spmdsim.tools._script import split_argv

__all__ = ["mpiexec_path", "before_import", "launch", "launch_hosts", "run_as_host_child"]

CHILD_ENV = "SPMDSIM_HOST_CHILD"

STOP_SECONDS = 10.0

LOOPBACK_ENV = {"UCX_NET_DEVICES": "lo"}  # UCX: the loopback device only (shared memory between hosts)


@functools.cache
def mpiexec_path() -> str | None:
    """MPICH's ``mpiexec`` (its Hydra launcher, whose options the launch passes): this Python environment's
    (where the ``mpich`` wheel puts it), else the one on PATH where that is MPICH's; else None (Open MPI's
    ``mpiexec`` takes other options: ``-iface`` is an error there)."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec")
    return found if found is not None and _is_hydra(found) else None


def _is_hydra(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is MPICH's Hydra: its ``--version`` says "HYDRA" (Open MPI's names OpenRTE or Open MPI)."""
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "HYDRA" in done.stdout + done.stderr


def _die_with_parent() -> None:
    """In the child before exec: get SIGINT when the launcher dies (Linux), so that no host outlives it."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGINT, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def before_import(command: str, raw: list[str]) -> int | None:
    """``spmdsim COMMAND RAW`` for ``run`` and ``compare``, before their modules (and JAX) are imported: under
    ``mpiexec``, the process it started runs the host as its child (:func:`run_as_host_child`); ``spmdsim run
    --hosts H`` launches the hosts, its command line read and checked as ``spmdsim run`` reads it
    (:mod:`spmdsim.tools._run_options`) and JAX's installed release checked from its metadata. Returns the exit
    status, or None where the command runs as usual (in one process, or as a host).

    Raises:
        UsageError: a mistake on the command line (the launcher's checks).
        ImportError: jax is not installed, or its release is not supported
            (:class:`spmdsim._jax_versions.UnsupportedJaxError`).
    """
    from spmdsim.hosts import launched_by_mpi
    if launched_by_mpi() and os.environ.get(CHILD_ENV) != "1":
        return run_as_host_child([command, *raw])
    from spmdsim.tools import _run_options
    if command != "run" or not any(a == "--hosts" or a.startswith("--hosts=")
                                   for a in split_argv(raw, _run_options.VALUED)[0]):
        return None  # (an abbreviated --hosts too: spmdsim run launches the hosts itself, after importing JAX)
    from spmdsim import _jax_versions
    _jax_versions.check_installed()  # first, as the import of spmdsim run's module would
    options = _run_options.read(raw)
    if options.args.hosts == 1:
        return None
    return launch_hosts(options.args.hosts, options.args.devices, options.host_argv())


def launch_hosts(hosts: int, devices: int, argv: list[str]) -> int:
    """:func:`launch` of ``hosts`` hosts sharing ``devices`` devices, after checking that they split evenly.

    Raises:
        UsageError: ``devices`` is not a multiple of ``hosts``, or MPI is not installed.
    """
    if devices % hosts:
        raise UsageError(f"--devices {devices} cannot be split evenly over --hosts {hosts}")
    return launch(hosts, argv)


def launch(hosts: int, argv: list[str]) -> int:
    """Run ``python -m spmdsim ARGV`` as ``hosts`` MPI processes; return mpiexec's exit status (130 after
    Ctrl-C).

    Raises:
      UsageError: no MPICH ``mpiexec`` or no ``mpi4py`` (the ``mpi`` extra is not installed).
    """
    mpiexec = mpiexec_path()
    try:
        import mpi4py  # noqa: F401 - only checked here; each host imports it
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        other = shutil.which("mpiexec")
        raise UsageError('--hosts needs MPI (mpi4py and MPICH\'s mpiexec): python -m pip install "spmdsim[mpi]"' +
                         (f" (the mpiexec on PATH, {other}, is another MPI's)" if other else ""))
    command = [*private_network(), mpiexec, "-iface", "lo", "-disable-auto-cleanup", "-n", str(hosts),
               sys.executable, "-m", "spmdsim", *argv]
    env = {**LOOPBACK_ENV, **os.environ}
    proc = subprocess.Popen(command, start_new_session=True, preexec_fn=_die_with_parent, env=env)
    interrupted = 0
    while True:
        try:
            status = proc.wait(timeout=STOP_SECONDS if interrupted else None)
            return 130 if interrupted and status != 0 else status
        except KeyboardInterrupt:
            interrupted += 1
            proc.send_signal(signal.SIGINT)  # mpiexec passes it to every host; the second one aborts them
        except subprocess.TimeoutExpired:
            interrupted += 1
            proc.send_signal(signal.SIGINT if interrupted < 4 else signal.SIGKILL)


@functools.lru_cache(maxsize=1)
def private_network() -> tuple:
    """The prefix that runs a command in a network namespace of its own with only loopback, up (see the module
    docstring), or () where the system does not allow it (or ``SPMDSIM_PRIVATE_NETWORK=0``)."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None)
    if os.environ.get("SPMDSIM_PRIVATE_NETWORK", "1") == "0" or not sys.platform.startswith("linux") \
            or unshare is None or ip is None:
        return ()
    prefix = (unshare, "--user", "--map-current-user", "--net", "--", "/bin/sh", "-c",
              f'"{ip}" link set lo up && exec "$@"', "sh")
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else ()


def run_as_host_child(argv: list[str]) -> int:
    """Under mpiexec: run ``python -m spmdsim ARGV`` as a child of this process (in the same process group, with
    MPICH's connection passed on) and return its exit status, 128 + the signal when a signal killed it, without
    dying of a signal here (see the module docstring). Ctrl-C and MPICH's failure notice (SIGUSR1) reach the child
    through the process group; this process ignores them. The child ignores the notice from its start (its host's
    watcher, :mod:`spmdsim.hosts.mpi`, takes it over once the host is up): one that came while it still imported
    JAX killed it with status 138 and no message (seen once, in a CI run on a loaded machine)."""
    for sig in (signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    fds = [int(os.environ[v]) for v in ("PMI_FD", "HYDI_CONTROL_FD") if os.environ.get(v, "").isdigit()]
    child = subprocess.Popen([sys.executable, "-m", "spmdsim", *argv], env={**os.environ, CHILD_ENV: "1"},
                             pass_fds=fds, preexec_fn=_child_setup)
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signal.SIGTERM))
    status = child.wait()
    return 128 - status if status < 0 else status


def _child_setup() -> None:
    """In the host child before exec: default Ctrl-C handling, MPICH's failure notice ignored (a lost host is the
    watcher's to report), and SIGKILL when its parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
