"""The JAX releases that spmdsim's JAX front end supports, checked before anything of JAX's internals is imported.

A release is supported when spmdsim follows *its* behaviour: the conformance suite and JAX's own pmap, shard_map
and op tests at that release's tag were run against it (README, "Supported versions"). The ``jax`` and ``test``
extras in ``pyproject.toml`` admit exactly :data:`REQUIREMENT` (a test checks that they agree), and
:func:`check` refuses any other release with :class:`UnsupportedJaxError` (an ``ImportError``: ``spmdsim run``
prints it in one line). The NumPy front end (``spmdsim.pmap``, ``spmdsim.shard_map``, ``spmdsim.lax``) does not
import JAX and works with any JAX, or none.

This module imports nothing of spmdsim's JAX front end, and JAX only in :func:`check`: it reads the installed
distribution's version, then ``jax.__version__``. :func:`check_installed` reads the version alone, for the launcher
of ``spmdsim run --hosts H``, which starts the hosts without importing JAX (see :mod:`spmdsim.tools._launch`).
"""
from __future__ import annotations

import re

__all__ = ["SUPPORTED", "REQUIREMENT", "MISSING", "UnsupportedJaxError", "check", "check_installed", "is_supported"]

#: The oldest supported release of each supported minor line, (0, 10, 2) for 0.10.2 and later 0.10 patches.
SUPPORTED = {(0, 10): (0, 10, 2), (0, 11): (0, 11, 2), (0, 12): (0, 12, 0, 1)}

#: The same set as a PEP 508 requirement (the ``jax`` and ``test`` extras).
REQUIREMENT = "jax>=0.10.2,!=0.11.0,!=0.11.1,!=0.12.0,<0.13"

_TESTED = "0.10.2, 0.11.2 and 0.12.0.1"

#: What an ``ImportError`` says where jax is not installed.
MISSING = ("spmdsim.jax needs jax: python -m pip install \"spmdsim[jax]\" (or jax jaxlib). The core, spmdsim.pmap and "
           "spmdsim.lax, works without it.")


class UnsupportedJaxError(ImportError):
    """The installed JAX is outside :data:`REQUIREMENT`: spmdsim's JAX front end does not know its internals."""


def _release(version: str) -> tuple[int, ...] | None:
    """``"0.12.0.1"`` -> ``(0, 12, 0, 1)``; None for a pre-release, a development build or an unreadable version
    (PEP 440 orders those before the release, so ``>=`` does not admit them)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)*)(\+[\w.]+)?", version.strip())
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def is_supported(version: str) -> bool:
    """Whether ``version`` (a ``jax.__version__``) satisfies :data:`REQUIREMENT`."""
    release = _release(version)
    if release is None:
        return False
    oldest = SUPPORTED.get(release[:2])
    return oldest is not None and release + (0,) * (len(oldest) - len(release)) >= oldest


def _message(version: str) -> str:
    return (f"spmdsim's JAX front end (spmdsim.jax, spmdsim run, spmdsim compare) supports jax {_TESTED} "
            f"({REQUIREMENT}); this environment has jax {version}. Install a supported JAX "
            f"(python -m pip install \"spmdsim[jax]\"), or use the NumPy front end (spmdsim.pmap, spmdsim.shard_map, "
            f"spmdsim.lax), which works with any JAX or none.")


def check() -> str:
    """Raise :class:`UnsupportedJaxError` unless the installed JAX is supported; return its version. The
    distribution's metadata is read first, so that an old JAX that cannot even be imported beside this NumPy is
    reported as such; then ``jax.__version__`` (the module that ``import jax`` finds). Raises ``ImportError``
    when jax is not installed."""
    _installed()
    import jax

    version = getattr(jax, "__version__", "unknown")
    if not is_supported(version):
        raise UnsupportedJaxError(_message(version))
    return version


def check_installed() -> str | None:
    """:func:`check` without importing jax (about a second of CPU): the installed distribution's version, checked.
    None where jax has no distribution metadata but can be imported (a source checkout on ``sys.path``): the
    processes that import it check it then.

    Raises:
        UnsupportedJaxError: the installed release is not supported.
        ImportError: jax is not installed (:data:`MISSING`).
    """
    import importlib.util

    installed = _installed()
    if installed is None and importlib.util.find_spec("jax") is None:
        raise ImportError(MISSING)
    return installed


def _installed() -> str | None:
    """The installed jax distribution's version from its metadata (None: no metadata), checked.

    Raises:
        UnsupportedJaxError: the installed release is not supported.
    """
    from importlib import metadata

    try:
        installed = metadata.version("jax")
    except metadata.PackageNotFoundError:
        return None
    if not is_supported(installed):
        raise UnsupportedJaxError(_message(installed))
    return installed
