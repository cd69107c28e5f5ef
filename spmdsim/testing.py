"""Differential testing against real ``jax.pmap``: is it my program, or the compiler?

``assert_pmap_matches_jax(fun, *args, **pmap_kwargs)`` runs a JAX function under ``spmdsim.jax.pmap`` (every
value computed by NumPy) and under ``jax.pmap`` (XLA), and compares the results: pytree structure, then per
leaf shape, dtype and values (exact for integers and bools; dtype-aware tolerances for floats). The first
difference is reported with its key path, device and index.

This module is also a pytest plugin (registered under the ``pytest11`` entry point): the fixture
``pmap_matches_jax`` is that function, so a test suite needs one line::

    def test_my_step(pmap_matches_jax):
        pmap_matches_jax(my_step, params, batch, axis_name="batch", in_axes=(None, 0))

jax is imported only when a comparison runs. Real ``jax.pmap`` needs as many XLA devices as the mapped size,
and jax has one CPU device unless told otherwise before its backend starts; the helpers arrange that
themselves (:func:`ensure_jax_devices`) when they still can, and otherwise say what to set and where.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["assert_pmap_matches_jax", "assert_trees_match", "ensure_jax_devices", "tolerance", "Mismatch",
           "TooFewJaxDevices", "compare"]

# (rtol, atol) per dtype name; integers, bools and unknown kinds compare exactly.
_TOLERANCES = {"float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 1e-2), "float32": (2e-6, 1e-6),
               "complex64": (2e-6, 1e-6), "float64": (1e-12, 1e-13), "complex128": (1e-12, 1e-13)}


class Mismatch(AssertionError):
    """Raised when two result pytrees differ; the message names the key path, device and index."""


def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) used for ``dtype``: (0, 0) for integers and bools."""
    return _TOLERANCES.get(np.dtype(dtype).name, (0.0, 0.0))


def _flatten(tree):
    import jax

    return jax.tree_util.tree_flatten_with_path(tree)


def assert_trees_match(actual, expected, *, out_axis: int | None = 0, what=("spmdsim", "jax"),
                       rtol: float | None = None, atol: float | None = None) -> None:
    """Compare two result pytrees: structure, then shape, dtype and values of every leaf.

    ``out_axis`` is where the device axis is in the leaves (for the report: "device 3"). Raises
    :class:`Mismatch` at the first difference.
    """
    import jax

    (a_leaves, a_tree), (e_leaves, e_tree) = _flatten(actual), _flatten(expected)
    if a_tree != e_tree:
        raise Mismatch(f"pytree structure differs: {what[0]} gave {a_tree}, {what[1]} gave {e_tree}")
    for (path, a), (_, e) in zip(a_leaves, e_leaves):
        where = "output" + jax.tree_util.keystr(path)
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape:
            raise Mismatch(f"{where}: shape {a.shape} from {what[0]}, but {e.shape} from {what[1]}")
        if a.dtype != e.dtype:
            raise Mismatch(f"{where}: dtype {a.dtype} from {what[0]}, but {e.dtype} from {what[1]}")
        r, t = tolerance(a.dtype)
        r, t = (rtol if rtol is not None else r), (atol if atol is not None else t)
        if a.dtype.kind in "fcV" or a.dtype.name == "bfloat16":
            a64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
            e64 = e.astype(np.complex128 if e.dtype.kind == "c" else np.float64)
            bad = ~np.isclose(a64, e64, rtol=r, atol=t, equal_nan=True)
        else:
            bad = a != e
        if np.any(bad):
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            device = f"device {index[out_axis]}, " if out_axis is not None and a.ndim > out_axis else ""
            raise Mismatch(f"{where}: values differ at {device}index {index}: {what[0]} gave {a[index]!r}, "
                           f"{what[1]} gave {e[index]!r} ({int(np.sum(bad))} of {a.size} elements differ; "
                           f"rtol={r}, atol={t})")


class TooFewJaxDevices(RuntimeError):
    """Real jax has fewer devices than a check maps over and cannot be given more: its CPU backend has
    started, or its devices are accelerators (whose count is the hardware's). A RuntimeError; the message says
    how to get them. ``spmdsim conformance --platform gpu`` skips the cases that raise it."""


def ensure_jax_devices(n: int, *, api: str = "ensure_jax_devices") -> None:
    """Make real jax offer at least ``n`` devices to ``jax.pmap``.

    Before jax's backend has started, this sets ``jax_num_cpu_devices`` to ``n`` or spmdsim's device count,
    whichever is larger (a count only takes effect then). After, it checks the count.

    Args:
        n: the devices needed (the mapped axis size).
        api: the function named in the error.

    Raises:
        TooFewJaxDevices: (a RuntimeError) jax has fewer than ``n`` devices and cannot be given more (its CPU
            backend already started, or they are accelerators); the message says what to set and where.
    """
    import jax
    from spmdsim.jax._internals import xla_bridge

    import spmdsim

    if not xla_bridge.backends_are_initialized():
        if jax.config.jax_num_cpu_devices < max(n, spmdsim.device_count()):
            jax.config.update("jax_num_cpu_devices", max(n, spmdsim.device_count()))
        return
    have = jax.device_count()
    if have >= n:
        return
    backend = jax.default_backend()
    if backend != "cpu":
        raise TooFewJaxDevices(
            f"{api}: jax.pmap needs {n} devices, but jax has {have} ({backend}), and an accelerator's device count "
            f"is the hardware's. Run the check on a machine with {n} {backend} devices, or on CPU devices: set "
            f"JAX_PLATFORMS=cpu and XLA_FLAGS=--xla_force_host_platform_device_count={max(n, 8)} before starting "
            f"Python.")
    raise TooFewJaxDevices(
        f"{api}: jax.pmap needs {n} devices, but jax has {have} ({backend}), and its backend has "
        f"already started, so the CPU device count can no longer be raised. Set it before jax runs anything: "
        f"put `jax.config.update(\"jax_num_cpu_devices\", {max(n, 8)})` right after `import jax` at the top of "
        f"your conftest.py (or test module), or set the environment variable "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={max(n, 8)} before starting Python.")


def _mapped_size(args: tuple, pmap_kwargs: dict) -> int | None:
    """The mapped axis size of a pmap call (``axis_size``, or the first mapped leaf's size along its axis);
    None when it cannot be told (jax.pmap then reports the problem itself)."""
    import jax

    if pmap_kwargs.get("axis_size") is not None:
        return int(pmap_kwargs["axis_size"])
    in_axes = pmap_kwargs.get("in_axes", 0)
    static = pmap_kwargs.get("static_broadcasted_argnums", ())
    static = {static} if isinstance(static, int) else set(static)
    dynamic = [a for k, a in enumerate(args) if k not in static and k - len(args) not in static]
    axes = [in_axes] * len(dynamic) if not isinstance(in_axes, (tuple, list)) else list(in_axes)
    sizes: list[int] = []
    try:
        for arg, axis in zip(dynamic, axes):
            jax.tree_util.tree_map(lambda ax, sub: sizes.extend(
                [] if ax is None else [np.shape(leaf)[ax] for leaf in jax.tree_util.tree_leaves(sub)]),
                axis, arg, is_leaf=lambda x: x is None)
    except Exception:  # noqa: BLE001 - malformed in_axes: jax.pmap raises its own error
        return None
    return sizes[0] if sizes else None


def assert_pmap_matches_jax(fun: Callable, *args, rtol: float | None = None, atol: float | None = None,
                            executor: str = "threads", **pmap_kwargs) -> Any:
    """Run ``fun`` under ``spmdsim.jax.pmap`` and ``jax.pmap`` with the same ``pmap_kwargs`` and compare.

    Real jax gets the devices it needs (:func:`ensure_jax_devices`), and spmdsim at least as many virtual
    devices as the mapped size.

    Args:
        fun: a JAX function (``jax.numpy``, ``jax.lax`` collectives, ...).
        *args: its arguments, as for ``jax.pmap(fun, **pmap_kwargs)(*args)``.
        rtol: relative tolerance for floats (default: per dtype, see :func:`tolerance`).
        atol: absolute tolerance for floats (default: per dtype).
        executor: spmdsim's executor, ``"threads"`` (the reference) or ``"vectorized"``.
        **pmap_kwargs: ``axis_name``, ``in_axes``, ``out_axes``, ... for both pmaps.

    Returns:
        spmdsim's result.

    Raises:
        Mismatch: the results differ (the first difference: key path, device, index), or only one side
            raised, or they raised different exception classes. Where jax.pmap ran on an accelerator, the
            message adds that spmdsim computes XLA:CPU's arithmetic (a GPU's float32 products are TF32, a
            TPU's bfloat16 passes, by default).
        TooFewJaxDevices: (a RuntimeError) real jax has too few devices (the message says what to set).
        Exception: the error both sides raised (spmdsim's, for inspection).
    """
    import jax

    import spmdsim
    import spmdsim.jax as sjax

    n = _mapped_size(args, pmap_kwargs) or 1
    ensure_jax_devices(n, api="assert_pmap_matches_jax")
    ours = sjax.pmap(fun, executor=executor, **pmap_kwargs)
    with spmdsim.set_device_count(max(n, spmdsim.device_count())):
        try:
            expected = jax.pmap(fun, **pmap_kwargs)(*args)
        except Exception as jax_error:  # noqa: BLE001 - compared below
            try:
                ours(*args)
            except type(jax_error):
                raise
            except Exception as e:  # noqa: BLE001
                raise Mismatch(f"jax.pmap raised {type(jax_error).__name__}: {jax_error}\nbut spmdsim raised "
                               f"{type(e).__name__}: {e}") from e
            raise Mismatch(f"jax.pmap raised {type(jax_error).__name__}: {jax_error}\nbut spmdsim returned a result")
        actual = ours(*args)
    out_axes = pmap_kwargs.get("out_axes", 0)
    try:
        assert_trees_match(actual, expected, out_axis=out_axes if isinstance(out_axes, int) else None, rtol=rtol,
                           atol=atol)
    except Mismatch as e:
        if jax.default_backend() == "cpu":
            raise
        raise Mismatch(f"{e}\n(jax.pmap ran on {jax.default_backend()}: spmdsim computes XLA:CPU's arithmetic, and "
                       f"an accelerator's float32 products are of lower precision by default (TF32 on GPUs, "
                       f"bfloat16 passes on TPUs); compare under jax.default_matmul_precision('highest'), or with "
                       f"a wider rtol)") from None
    return actual


def compare(fun: Callable, *args, against: str = "xla", ulps: int = 0, rtol: float | None = None,
            progress: bool = False, **map_kwargs):
    """Where do ``fun``'s values leave XLA:CPU's? Run it with every equation spmdsim evaluates compared, on the
    same operands, with what XLA:CPU computes (``spmdsim compare`` for a function; see
    :mod:`spmdsim.jax.tools._compare` for what each side computes).

    With ``map_kwargs`` (``axis_name``, ``in_axes``, ``executor``, ...), ``fun`` is a per-device function run as
    ``spmdsim.jax.pmap(fun, **map_kwargs)(*args)``; without, ``fun(*args)`` runs as under ``spmdsim run``: its
    ``jax.pmap``, ``jax.shard_map`` and ``jax.jit`` are spmdsim's (so jit around maps, grad of them and nested
    maps are compared too). Not for the NumPy front end (``spmdsim.pmap``): compare its ``jax.numpy`` twin.

    Args:
        fun: a JAX function.
        *args: its arguments.
        against: ``"xla"`` (default), ``"order=pairwise"`` (``ring``, ``sequential``: each sum over devices folded
            in that order) or ``"executor=vectorized"`` (``threads``: the other executor's rules).
        ulps: an element differs when more than this many ulps apart (default 0: bit-exact).
        rtol: and, when given, more than ``rtol * |expected|`` apart.
        progress: a progress line on stderr for long runs (rich, on a terminal).
        **map_kwargs: ``spmdsim.jax.pmap``'s keyword arguments.

    Returns:
        A ``Report``: ``report.differences`` (each differing equation, first occurrence first: primitive,
        params, operands, devices, ulps, absolute distance, the user's line), ``report.drift`` (each map call's
        outputs against the other side's run of the whole map), ``report.to_json()``, ``report.print()``;
        ``bool(report)`` is true when some equation differs. ``report.result`` is what ``fun`` returned.

    Raises:
        ValueError: an unknown ``against`` or a negative tolerance.

    Example (needs jax)::

        report = spmdsim.testing.compare(step, params, batch, axis_name="batch", in_axes=(None, 0))
        assert not report, report.text()
    """
    import spmdsim
    from spmdsim.jax.tools import _compare

    if map_kwargs:
        import spmdsim.jax as sjax
        mapped = sjax.pmap(fun, **map_kwargs)
        n = _mapped_size(args, map_kwargs) or 1
        with spmdsim.set_device_count(max(n, spmdsim.device_count())):
            report, result = _compare.compare_call(lambda: mapped(*args), against=against, ulps=ulps, rtol=rtol,
                                                   progress=progress)
    else:
        from spmdsim.jax.integration._patch import patched_jax
        with patched_jax(spmdsim.device_count()):
            report, result = _compare.compare_call(lambda: fun(*args), against=against, ulps=ulps, rtol=rtol,
                                                   progress=progress)
    report.result = result
    return report


try:  # the pytest plugin; nothing here imports jax
    import pytest

    @pytest.fixture
    def pmap_matches_jax():
        """``assert_pmap_matches_jax`` as a fixture: ``pmap_matches_jax(fun, *args, **pmap_kwargs)``."""
        return assert_pmap_matches_jax
except ImportError:  # pragma: no cover - pytest is a test extra
    pass
