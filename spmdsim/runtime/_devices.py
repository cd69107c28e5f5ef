"""Virtual devices: how many there are, and the objects `spmdsim.devices()` returns.

JAX fixes the number of CPU devices before start-up (``XLA_FLAGS=--xla_force_host_platform_device_count``
or ``jax.config.update("jax_num_cpu_devices", n)`` before first use). spmdsim's devices are only names,
so the count can change at any time:

- at start-up from the environment variable ``SPMDSIM_NUM_DEVICES`` (default 8);
- at run time with :func:`set_device_count`, globally or, used as a context manager, for a block.
"""
from __future__ import annotations

import dataclasses
import os

from spmdsim.runtime import _process_group, _runtime

__all__ = ["VirtualDevice", "devices", "device_count", "local_device_count", "local_devices", "set_device_count"]

ENV_VAR = "SPMDSIM_NUM_DEVICES"
DEFAULT_DEVICE_COUNT = 8


@dataclasses.dataclass(frozen=True)
class VirtualDevice:
    """One virtual device. Mirrors the fields of a ``jax.Device`` that programs commonly read."""

    id: int
    platform: str = "spmdsim"
    device_kind: str = "virtual"
    process_index: int = 0

    def __repr__(self) -> str:
        return f"VirtualDevice(id={self.id})" if not self.process_index else \
            f"VirtualDevice(id={self.id}, process_index={self.process_index})"


def _check_count(n, source: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{source}: the device count must be a positive int, got {n!r}.")
    return n


def _count_from_env() -> int:
    raw = os.environ.get(ENV_VAR)
    if raw is None or raw.strip() == "":
        return DEFAULT_DEVICE_COUNT
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_VAR}={raw!r}: expected a positive integer such as 8.") from None
    return _check_count(value, ENV_VAR)


_count = _count_from_env()


_layout = _process_group.layout  # (hosts, local devices) in a multi-host run, else None


# How a user asks for more virtual devices, for error messages: ``spmdsim run`` says "--devices N".
_more_devices_hint = "spmdsim.set_device_count({n}) or SPMDSIM_NUM_DEVICES={n}"


def more_devices_hint(n: int) -> str:
    """How to get ``n`` virtual devices, in the words of the current entry point (the API, or a command)."""
    return _more_devices_hint.format(n=n)


class devices_hint:
    """``with devices_hint("spmdsim run --devices {n}"):``: error messages suggest that instead."""

    def __init__(self, template: str):
        self.template = template

    def __enter__(self):
        global _more_devices_hint
        self.previous, _more_devices_hint = _more_devices_hint, self.template
        return self

    def __exit__(self, *exc):
        global _more_devices_hint
        _more_devices_hint = self.previous


def device_count() -> int:
    """The number of virtual devices (like ``jax.device_count()``): in a multi-host run, every host's (see
    :mod:`spmdsim.runtime._process_group`)."""
    found = _layout()
    return _count if found is None else found[0] * found[1]


def local_device_count() -> int:
    """This host's virtual devices (like ``jax.local_device_count()``): all of them with one host."""
    found = _layout()
    return _count if found is None else found[1]


def devices(backend=None) -> list[VirtualDevice]:
    """The virtual devices, ``[VirtualDevice(id=0), ..., VirtualDevice(id=n-1)]`` (like ``jax.devices()``): in a
    multi-host run every host's, host-major, each with its ``process_index``.

    ``backend`` is accepted for signature compatibility and ignored: every backend is simulated.
    """
    found = _layout()
    if found is None:
        return [VirtualDevice(i) for i in range(_count)]
    return [VirtualDevice(i, process_index=i // found[1]) for i in range(found[0] * found[1])]


def local_devices() -> list[VirtualDevice]:
    """This host's virtual devices (``jax.local_devices()``): global devices ``h * L`` to ``h * L + L - 1``; all
    of them with one host."""
    group = _process_group.current()
    return devices() if group.local is None else devices()[group.devices.start:group.devices.stop]


class set_device_count:
    """Set the number of virtual devices; usable as a statement or as a context manager.

    >>> import spmdsim
    >>> with spmdsim.set_device_count(4):
    ...     spmdsim.device_count()
    4

    As a plain call the new count stays in force. Used with ``with``, the previous count comes back at the
    end of the block. Unlike JAX's ``jax_num_cpu_devices`` this may be called at any time, but not from
    inside a mapped function (ValueError): the devices of a running call cannot change under it.
    """

    def __init__(self, n: int):
        global _count
        if _runtime.current_lane() is not None:
            raise ValueError("set_device_count cannot be called inside a mapped function; call it before pmap.")
        if _layout() is not None:
            raise ValueError("set_device_count cannot be called in a multi-host run: the hosts' devices are fixed "
                             "when it starts (spmdsim.run_hosts, spmdsim run --hosts).")
        self.previous = _count
        _count = _check_count(n, "set_device_count")

    def __enter__(self) -> "set_device_count":
        return self

    def __exit__(self, *exc) -> None:
        global _count
        _count = self.previous
