"""Accelerators as data: the chips of ``spmdsim/data/hardware.json`` (or a file of your own), and a topology of
them that a mesh of virtual devices is laid on.

A :class:`Chip` is what one accelerator can do (peak FLOP/s per dtype, HBM capacity and bandwidth) and how it
is connected (a TPU's torus of ICI links, or a GPU's NVLink switch inside a node and the network between
nodes). A :class:`Topology` is a number of chips and their arrangement: ``tpu-v5e:2x4`` (a 2x4 slice, no
wraparound, since v5e's axes wrap only at 16), ``tpu-v5p:4x4x4`` (a cube, every axis wrapped), ``h100:8`` (one
node of 8), ``h100:16`` (two nodes). Virtual device ``d`` is chip ``d``, in JAX's device order: on a TPU,
``jax.devices()`` numbers chips with the first topology axis varying fastest, so device ``d``'s coordinates are
``numpy.unravel_index(d, shape, order="F")``; on GPUs device ``d`` is GPU ``d % node_size`` of node
``d // node_size``.

Pure standard library and NumPy: no jax.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

__all__ = ["Chip", "Topology", "chips", "chip", "topology", "load_chip", "DEFAULT_SHAPES"]

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "hardware.json")

# The slice a TPU of n chips is taken to be when only the count is given (``tpu-v5e:8``): Google Cloud's
# shapes for those counts (v5e/v6e: 2x2, 2x4, 4x4, ...; v4/v5p: 2x2x1, 2x2x2, ...).
DEFAULT_SHAPES = {
    2: {2: (1, 2), 3: (1, 2, 1)}, 4: {2: (2, 2), 3: (2, 2, 1)}, 8: {2: (2, 4), 3: (2, 2, 2)},
    16: {2: (4, 4), 3: (2, 2, 4)}, 32: {2: (4, 8), 3: (2, 4, 4)}, 64: {2: (8, 8), 3: (4, 4, 4)},
    128: {2: (8, 16), 3: (4, 4, 8)}, 256: {2: (16, 16), 3: (4, 8, 8)},
}


def _values(tree: Any) -> Any:
    """A description with every ``{"value": v, "source": s}`` replaced by ``v``."""
    if isinstance(tree, dict):
        if set(tree) >= {"value"} and set(tree) <= {"value", "source"}:
            return tree["value"]
        return {k: _values(v) for k, v in tree.items() if not k.startswith("_")}
    return tree


def _sources(tree: Any, prefix: str = "") -> dict:
    found = {}
    if isinstance(tree, dict):
        if "value" in tree and "source" in tree:
            return {prefix: tree["source"]}
        for k, v in tree.items():
            if not k.startswith("_"):
                found.update(_sources(v, f"{prefix}.{k}" if prefix else k))
    return found


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator. ``peak_flops``: dtype name (``bf16``, ``f32``, ``int8``, ``fp8``, ``tf32``) -> FLOP/s;
    ``interconnect``: for ``kind == "tpu"`` ``link_bandwidth`` (one way, per link, bytes/s), ``wraparound``
    (``"16"``: an axis wraps when it has 16 chips; ``"multiple of 4"``), ``hop_latency`` (s), ``dims``; for
    ``kind == "gpu"`` ``node_size``, ``gpu_bandwidth`` (each GPU's NVLink egress, one way), ``node_bandwidth``
    (a node's network egress), ``hop_latency``, ``node_latency``. ``sources``: the public source of each value."""

    key: str
    name: str
    kind: str
    peak_flops: dict
    hbm_bytes: float
    hbm_bandwidth: float
    interconnect: dict
    vector_flops: float | None = None
    sources: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, key: str, description: dict) -> "Chip":
        """A chip from its description in hardware.json's format (values bare or as ``{"value", "source"}``)."""
        v = _values(description)
        missing = [k for k in ("kind", "peak_flops", "hbm_bytes", "hbm_bandwidth", "interconnect") if k not in v]
        if missing:
            raise ValueError(f"chip {key!r}: its description has no {', '.join(missing)}")
        if v["kind"] not in ("tpu", "gpu"):
            raise ValueError(f"chip {key!r}: kind must be 'tpu' (a torus) or 'gpu' (switched nodes), got {v['kind']!r}")
        return cls(key, v.get("name", key), v["kind"], dict(v["peak_flops"]), float(v["hbm_bytes"]),
                   float(v["hbm_bandwidth"]), dict(v["interconnect"]), v.get("vector_flops"), _sources(description))

    def peak(self, dtype: str, precision: str | None = None) -> float:
        """Peak FLOP/s of a dot of ``dtype`` (a name as :func:`dtype_class` gives) at a ``jax.lax.Precision``
        name: TPUs run float32 dots as 1 (DEFAULT), 3 (HIGH) or 6 (HIGHEST) bfloat16 passes; GPUs as TF32
        (DEFAULT, HIGH) or on the CUDA cores (HIGHEST)."""
        p = self.peak_flops
        if dtype in ("f32", "f64"):
            if self.kind == "tpu":
                passes = {"HIGH": 3, "HIGHEST": 6}.get(precision or "", 1)
                return p.get("f32", p["bf16"]) / passes
            if precision == "HIGHEST" or "tf32" not in p:
                return p.get("f32", p["bf16"])
            return p["tf32"]
        if dtype in p:
            return p[dtype]
        if dtype == "fp8":
            return p.get("int8", p["bf16"])
        return p["bf16"]

    @property
    def critical_intensity(self) -> float:
        """bf16 peak FLOP/s over HBM bytes/s: the arithmetic intensity above which a bf16 matmul is
        compute-bound (book 'roofline': 240 on TPU v5e)."""
        return self.peak_flops["bf16"] / self.hbm_bandwidth


def chips(path: str | None = None) -> dict[str, Chip]:
    """Every chip of ``hardware.json`` (or of the file at ``path``), by key (``tpu-v5e``, ``h100``, ...)."""
    with open(path or DATA) as f:
        data = json.load(f)
    return {key: Chip.from_dict(key, d) for key, d in data["chips"].items()}


_CHIPS: dict | None = None


def chip(key: str) -> Chip:
    """The chip named ``key`` (case and ``_`` tolerated: ``TPU_v5e``, ``tpu-v5e``, ``v5e``, ``H100``)."""
    global _CHIPS
    if _CHIPS is None:
        _CHIPS = chips()
    k = key.lower().replace("_", "-")
    found = _CHIPS.get(k) or _CHIPS.get(f"tpu-{k}")
    if found is None:
        raise ValueError(f"unknown chip {key!r}; known: {', '.join(_CHIPS)} (or a FILE.json describing one)")
    return found


def load_chip(path: str) -> Chip:
    """A chip described in a JSON file: one chip's object (as under ``chips`` in hardware.json), or a file of
    hardware.json's format with exactly one chip."""
    with open(path) as f:
        data = json.load(f)
    if "chips" in data:
        if len(data["chips"]) != 1:
            raise ValueError(f"{path}: expected one chip, found {len(data['chips'])}")
        (key, d), = data["chips"].items()
        return Chip.from_dict(key, d)
    return Chip.from_dict(os.path.splitext(os.path.basename(path))[0], data)


@dataclasses.dataclass(frozen=True)
class Topology:
    """``chip`` repeated over ``shape``: a TPU slice (one entry per torus axis; ``wraparound`` per axis,
    default by the chip's rule) or GPUs (``shape == (count,)``, in nodes of the chip's node size)."""

    chip: Chip
    shape: tuple
    wraparound: tuple = ()

    def __post_init__(self):
        if not self.wraparound:
            object.__setattr__(self, "wraparound", tuple(self._wraps(n) for n in self.shape))
        if len(self.wraparound) != len(self.shape):
            raise ValueError(f"wraparound {self.wraparound} does not match the shape {self.shape}")

    def _wraps(self, n: int) -> bool:
        if self.chip.kind != "tpu" or n < 3:
            return False
        rule = str(self.chip.interconnect.get("wraparound", ""))
        if rule.startswith("multiple of"):
            return n % int(rule.split()[-1]) == 0
        return rule.isdigit() and n == int(rule)

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def label(self) -> str:
        """``TPU v5e 2x4``, ``NVIDIA H100 SXM5 x8``."""
        if self.chip.kind == "tpu":
            return f"{self.chip.name} {'x'.join(map(str, self.shape))}"
        return f"{self.chip.name} x{self.count}"

    @property
    def spec(self) -> str:
        return f"{self.chip.key}:{'x'.join(map(str, self.shape))}"

    def coords(self, device: int) -> tuple:
        """Chip ``device``'s torus coordinates (first axis fastest, as TPU device ids count), or for GPUs
        ``(node, local index)``."""
        if self.chip.kind == "gpu":
            size = int(self.chip.interconnect["node_size"])
            return (device // size, device % size)
        return tuple(int(c) for c in np.unravel_index(device, self.shape, order="F"))

    @property
    def node_size(self) -> int:
        return int(self.chip.interconnect.get("node_size", self.count))


def topology(spec: "str | Topology", devices: int | None = None) -> Topology:
    """``CHIP:SHAPE`` (``tpu-v5e:2x4``, ``tpu-v5p:2x2x2``, ``h100:8``; ``CHIP:N`` for a TPU takes Google
    Cloud's slice of N chips; ``CHIP`` alone takes ``devices`` chips) or ``FILE.json:SHAPE`` as a
    :class:`Topology`. Raises ValueError for an unknown chip or a shape that does not fit the chip."""
    if isinstance(spec, Topology):
        return spec
    name, _, shape_text = spec.partition(":")
    c = load_chip(name) if name.endswith(".json") else chip(name)
    if not shape_text:
        if devices is None:
            raise ValueError(f"--hardware {spec}: give the chips' arrangement, e.g. {name}:8 or {name}:2x4")
        shape_text = str(devices)
    try:
        shape = tuple(int(s) for s in shape_text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--hardware {spec}: the shape {shape_text!r} is not like 8 or 2x4") from None
    if not shape or min(shape) < 1:
        raise ValueError(f"--hardware {spec}: bad shape {shape_text!r}")
    if c.kind == "gpu":
        return Topology(c, (math.prod(shape),))
    dims = int(c.interconnect.get("dims", 2))
    if len(shape) == 1:
        n = shape[0]
        shape = DEFAULT_SHAPES.get(n, {}).get(dims) or ((n,) + (1,) * (dims - 1))
    if len(shape) > dims:
        raise ValueError(f"--hardware {spec}: {c.name} is a {dims}D torus; got {len(shape)} axes")
    return Topology(c, shape + (1,) * (dims - len(shape)))
