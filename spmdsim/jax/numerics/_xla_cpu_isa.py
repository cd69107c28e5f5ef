"""The instruction set XLA:CPU compiles for on this machine, and which of its results depend on it.

XLA:CPU (jaxlib 0.10) compiles every program for the features of the CPU it runs on (LLVM's host feature
detection), capped by ``--xla_cpu_max_isa=LEVEL`` in ``XLA_FLAGS``; the levels, in order, are ``SSE4_2``,
``AVX``, ``AVX2``, ``AVX512``, ``AVX512_VNNI``, ``AVX512_BF16``, ``AMX`` and ``AMX_FP16`` (XLA's
``--xla_cpu_max_isa`` documentation). Most results do not depend on it; these do, measured with jax 0.10.2 on
an Intel Xeon with AVX-512, AVX512-FP16, AVX512-BF16 and AMX under every cap (``conformance/test_isa.py``
checks each against XLA:CPU, and reruns the differential tests under every cap the machine supports):

==================================  =========================================  ==============================
feature in effect                   what XLA:CPU computes with it              without it
==================================  =========================================  ==============================
``fma`` (CPU has FMA3, cap AVX2+)   fused multiply-adds in its float32 ports   separate multiply and add
                                    of ``exp``, ``log``, ... and in samplers
``avx512f`` (CPU has it, cap        sums and products over two axes in its     another order (within 2 ulps;
AVX512+)                            own vectorised order (modelled for AMD     modelled on AMD Zen 3, not
                                    Zen 4, jaxlib 0.10: ``_outer_lanes``)      under the cap: see the report)
``avx512_fp16`` (CPU has it, cap    float64 -> float16 rounded once            through float32: rounded twice
AVX512+)                            (``vcvtsd2sh``)
                                    a float16 multiply feeding an add: one     the product rounded to float16,
                                    float16 fused multiply-add                 then the sum
==================================  =========================================  ==============================

(The ``AVX512`` cap keeps AVX512-FP16 on a CPU that has it: the cap removes the levels above it, and XLA has
no level of its own for FP16. At ``SSE4_2`` XLA:CPU cannot convert to float16 at all: its JIT lacks
``__truncsfhf2``. bfloat16 arithmetic and conversions, float32 and float64 results other than the above, and
dot products measured the same under every cap.)

``SPMDSIM_XLA_CPU_ISA=LEVEL`` pins the model to a CPU with exactly that level's features, whatever this machine
has (to reproduce a colleague's run): one of XLA's levels, or ``AVX512_FP16`` (an AVX-512 CPU with FP16, as
Sapphire Rapids; ``AMX`` and ``AMX_FP16`` imply it too). The model is read once per process, as XLA reads its
flags once. Only the JAX front end follows it; the NumPy front end keeps its own documented semantics.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
import re

__all__ = ["LEVELS", "MODELS", "Isa", "cpu_model", "current", "exact", "jaxlib_minor", "model", "ynnpack_orders"]

LEVELS = ("SSE4_2", "AVX", "AVX2", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AMX", "AMX_FP16")
# the lowest level at which a cap lets XLA use each feature that changes results (measured, see above)
_FEATURE_LEVEL = {"fma": "AVX2", "avx512f": "AVX512", "avx512_fp16": "AVX512"}
# the features a CPU of each level has, for a pinned model
_AVX512, _FP16 = {"fma", "avx512f"}, {"fma", "avx512f", "avx512_fp16"}
_PINNED = {"SSE4_2": set(), "AVX": set(), "AVX2": {"fma"}, "AVX512": _AVX512, "AVX512_VNNI": _AVX512,
           "AVX512_BF16": _AVX512, "AVX512_FP16": _FP16, "AMX": _FP16, "AMX_FP16": _FP16}


@dataclasses.dataclass(frozen=True)
class Isa:
    """The features that change XLA:CPU's results, as XLA uses them here. ``source`` says where they come
    from (the CPU and the cap, or the pinned level)."""

    features: frozenset
    source: str

    @property
    def fma(self) -> bool:
        """Multiply-adds are fused (FMA3 instructions, from AVX2 on)."""
        return "fma" in self.features

    @property
    def avx512(self) -> bool:
        """AVX-512 (its vector width changes the order of some of XLA's multi-axis reductions)."""
        return "avx512f" in self.features

    @property
    def fp16(self) -> bool:
        """float16 arithmetic and conversions in hardware (AVX512-FP16)."""
        return "avx512_fp16" in self.features

    def __str__(self) -> str:
        return f"{', '.join(sorted(self.features)) or 'no FMA, no FP16'} ({self.source})"


def model(cpu_flags: set[str] | None, max_isa: str | None = None, pinned: str | None = None) -> Isa:
    """The features XLA:CPU uses on a CPU with ``cpu_flags`` (as ``/proc/cpuinfo`` names them; None: not an
    x86-64 CPU spmdsim can read, taken as one with FMA and no FP16) under the cap ``max_isa`` (XLA_FLAGS'
    ``--xla_cpu_max_isa``), or the ``pinned`` level's. Raises ValueError naming the levels for an unknown one."""
    if pinned:
        level = pinned.upper()
        if level not in _PINNED:
            raise ValueError(f"SPMDSIM_XLA_CPU_ISA={pinned!r} is not a level spmdsim models: expected one of "
                             f"{', '.join(_PINNED)}.")
        return Isa(frozenset(_PINNED[level]), f"pinned: SPMDSIM_XLA_CPU_ISA={level}")
    if cpu_flags is None:
        return Isa(frozenset({"fma"}), f"assumed: a {platform.machine() or 'non-x86'} CPU with FMA")
    cap = None
    if max_isa:
        cap = max_isa.upper()
        if cap not in LEVELS:
            raise ValueError(f"--xla_cpu_max_isa={max_isa} in XLA_FLAGS is not one of XLA's levels "
                             f"({', '.join(LEVELS)}); XLA would reject it too.")
    allowed = {f for f, level in _FEATURE_LEVEL.items()
               if f in cpu_flags and (cap is None or LEVELS.index(cap) >= LEVELS.index(level))}
    return Isa(frozenset(allowed), "this CPU" + (f", XLA_FLAGS --xla_cpu_max_isa={cap}" if cap else ""))


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` (Linux, x86-64), else None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        return None
    return None


def _max_isa(xla_flags: str) -> str | None:
    found = re.findall(r"--xla_cpu_max_isa=(\S*)", xla_flags)
    return found[-1] if found else None  # XLA takes the last occurrence


@functools.cache
def current() -> Isa:
    """This process's model: ``SPMDSIM_XLA_CPU_ISA`` if set, else this CPU under XLA_FLAGS' cap."""
    return model(_cpu_flags(), _max_isa(os.environ.get("XLA_FLAGS", "")), os.environ.get("SPMDSIM_XLA_CPU_ISA"))


# -- the CPU model, beyond its ISA ----------------------------------------------------------------------------
# LLVM compiles XLA:CPU's code for the host CPU's model (its -mcpu: vector width preferences, interleaving), and
# Eigen sizes its product blocks by the caches that CPUID reports, so some orders of additions depend on the
# model and not only on the features above. spmdsim names the models it has measured.

MODELS = ("amd-zen4", "amd-zen3", "intel")


def _vendor_model(cpuinfo: str) -> str:
    """The measured model nearest to a ``/proc/cpuinfo`` text: for AMD family 25, ``amd-zen4`` where the CPU has
    AVX-512 (Zen 4: Genoa, Raphael, ...) and ``amd-zen3`` where it has not (Zen 3: Milan, Vermeer, ...; YNNPACK
    picks other dot kernels there), else ``intel`` (the Xeons earlier measurements were made on)."""
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines()[:30] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    if fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25":
        return "amd-zen4" if "avx512f" in fields.get("flags", "").split() else "amd-zen3"
    return "intel"


@functools.cache
def cpu_model() -> str:
    """The CPU model XLA:CPU's CPU-dependent orders are taken from: ``SPMDSIM_XLA_CPU_MODEL`` if set (one of
    ``MODELS``; to reproduce a colleague's machine), else this machine's. Raises ValueError for an unknown
    name."""
    pinned = os.environ.get("SPMDSIM_XLA_CPU_MODEL")
    if pinned:
        if pinned not in MODELS:
            raise ValueError(f"SPMDSIM_XLA_CPU_MODEL={pinned!r} is not a CPU model spmdsim has measured: expected "
                             f"one of {', '.join(MODELS)}.")
        return pinned
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return _vendor_model(f.read(1 << 14))
    except OSError:
        return "intel"


@functools.cache
def exact() -> bool:
    """``SPMDSIM_EXACT=1``: compute XLA:CPU's order of operations where doing so by default would cost too much
    speed (documented per primitive in docs/semantics.md)."""
    return os.environ.get("SPMDSIM_EXACT", "") not in ("", "0")


@functools.cache
def jaxlib_minor() -> tuple[int, int] | None:
    """The installed jaxlib's ``(major, minor)`` (its distribution's metadata), or None without one."""
    from importlib import metadata
    try:
        found = re.match(r"(\d+)\.(\d+)", metadata.version("jaxlib"))
    except metadata.PackageNotFoundError:
        return None
    return (int(found[1]), int(found[2])) if found else None


def ynnpack_orders() -> bool:
    """Whether spmdsim computes float32 sums (and, where :mod:`._xla_cpu_dot` knows the model's kernels, products)
    in XLA:CPU's order, as measured: on AMD Zen 4 and Zen 3 (:func:`cpu_model`) with jaxlib 0.10 (jaxlib 0.12
    orders some of them otherwise, and other CPU models are not measured). Elsewhere NumPy's and BLAS's orders
    apply."""
    return cpu_model() in ("amd-zen4", "amd-zen3") and jaxlib_minor() == (0, 10)
