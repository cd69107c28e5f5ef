"""Every lax primitive against XLA:CPU, table-driven (the op records of ``conformance/lax_records.py``), and
every vectorized rule against its per-device twin, bit for bit.

For each record (a primitive, the dtypes JAX allows for it, argument shapes including scalars, empty and
non-contiguous arrays, parameter variants), one function applies the primitive to every case and returns all
results; it runs

- on XLA:CPU: ``jax.jit(op)(*args)``, the expected values;
- on spmdsim: ``spmdsim.jax.eval_jaxpr`` of ``jax.make_jaxpr(op)(*args)``, compared value by value within
  ``TOLERANCE`` (ulps per primitive and dtype, exact unless listed), shape and dtype exactly;
- equation by equation over 3 devices: each equation's ``VECTORIZED`` rule on the devices' stacked operands
  against its ``PER_DEVICE`` rule on each device's operands, bit for bit (NaN payloads aside).

64-bit dtypes run with ``jax_enable_x64`` on (``wide=True``), the others with JAX's default. The worst ulp
distance measured per primitive and dtype goes to the conformance report (``spmdsim conformance``).
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools

import jax
import numpy as np
import pytest
from jax.extend import core as ext_core

import spmdsim.jax as sjax
from conformance.lax_records import RECORDS, TOLERANCE, WIDE, on_accelerator, tolerance
from spmdsim.jax.tools._coverage import LEAD_OWNED
from spmdsim.jax.evaluation._interpreter import HIGHER_ORDER, REFERENCE
from spmdsim.jax.evaluation._registry import PER_DEVICE, VECTORIZED

DEVICES = 3
_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr", "composite": "jaxpr",
          "eval_jaxpr": "call_jaxpr"}


def ordered(x: np.ndarray) -> np.ndarray:
    """Floats as unsigned integers in the order of their values (adjacent floats differ by 1)."""
    u = np.ascontiguousarray(x).view(np.dtype(f"u{x.dtype.itemsize}"))
    top = np.asarray(1 << (8 * x.dtype.itemsize - 1), u.dtype)
    return np.where((u & top) != 0, ~u, u | top).astype(u.dtype)


def ulps(actual: np.ndarray, expected: np.ndarray) -> float:
    """The largest distance in units in the last place between two float (or complex) arrays; inf where one is
    NaN and the other not, or infinities differ."""
    if actual.size == 0:
        return 0.0
    if actual.dtype.kind == "c":
        return max(ulps(np.real(actual), np.real(expected)), ulps(np.imag(actual), np.imag(expected)))
    a, e = ordered(actual), ordered(expected)
    distance = np.where(a > e, a - e, e - a).astype(np.float64)
    an, en = np.isnan(actual.astype(np.float32) if actual.dtype.itemsize < 4 else actual), \
        np.isnan(expected.astype(np.float32) if expected.dtype.itemsize < 4 else expected)
    distance = np.where(an & en, 0.0, np.where(an | en, np.inf, distance))
    return float(distance.max())


def _is_float(dtype) -> bool:
    return np.dtype(dtype).kind in "fc" or np.dtype(dtype).name in ("bfloat16", "float16")


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if _is_float(a.dtype):
        return ulps(a, b) == 0
    return np.array_equal(a, b)


def _per_device_call(eqn):
    """The per-device function the interpreter binds for ``eqn``: the rule's specialisation, else the rule
    (for a higher-order primitive, its rule with the reference executor)."""
    if eqn.primitive.name in HIGHER_ORDER:
        return functools.partial(HIGHER_ORDER[eqn.primitive.name], REFERENCE, **eqn.params)
    rule = PER_DEVICE[eqn.primitive.name]
    specializer = getattr(rule, "specialize", None)
    call = specializer(eqn) if specializer is not None else None
    return call if call is not None else functools.partial(rule, **eqn.params)


def check_vectorized(jaxpr, consts, device_args: list[list], problems: list, where: str = "") -> list[list]:
    """Evaluate ``jaxpr`` per device, checking every equation's vectorized rule on the stacked operands
    against the per-device results; returns each device's outputs."""
    from spmdsim.jax.evaluation._dtypes import numpy_dtype

    def read(env, v):
        if isinstance(v, ext_core.Literal):
            return np.asarray(v.val, dtype=numpy_dtype(v.aval.dtype))
        return env[v]

    envs = [dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, args)) for args in device_args]
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [[np.asarray(read(env, v)) for v in eqn.invars] for env in envs]
        if name in _CALLS:
            sub = eqn.params.get(_CALLS[name], eqn.params.get("call_jaxpr"))  # (composite's from JAX 0.12)
            inner, sub_consts = (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, ())
            outs = check_vectorized(inner, sub_consts, ins, problems, where + f"{name}/")
        else:
            call = _per_device_call(eqn)
            outs = []
            for d in range(len(envs)):
                with np.errstate(all="ignore"):
                    out = call(*ins[d])
                outs.append(list(out) if eqn.primitive.multiple_results else [out])
            if name not in LEAD_OWNED:
                if name not in VECTORIZED:
                    problems.append(f"{where}{name}: no vectorized rule")
                else:
                    stacked = [np.broadcast_to(np.asarray(read(envs[0], v)), (len(envs), *np.shape(read(envs[0], v))))
                               if isinstance(v, ext_core.Literal) else np.stack([i[k] for i in ins])
                               for k, v in enumerate(eqn.invars)]
                    with np.errstate(all="ignore"):
                        vout = VECTORIZED[name](*stacked, **eqn.params)
                    vout = list(vout) if eqn.primitive.multiple_results else [vout]
                    for k, v in enumerate(vout):
                        v = np.asarray(v)
                        if not eqn.invars:  # nullary: one value with a leading axis of 1, broadcast to the devices
                            v = np.broadcast_to(v, (len(envs), *v.shape[1:]))
                        for d in range(len(envs)):
                            if not _same_bits(v[d], np.asarray(outs[d][k])):
                                problems.append(f"{where}{name} (params {_short(eqn.params)}): vectorized result "
                                                f"{k} differs from device {d}'s per-device result")
                                break
        for env, out in zip(envs, outs):
            for var, value in zip(eqn.outvars, out):
                if not isinstance(var, ext_core.DropVar):
                    env[var] = np.asarray(value)
    return [[np.asarray(read(env, v)) for v in jaxpr.outvars] for env in envs]


def _short(params) -> str:
    text = ", ".join(f"{k}={v}" for k, v in params.items() if "jaxpr" not in k)
    return text if len(text) < 200 else text[:200] + "..."


def _widths(record) -> list[bool]:
    """The x64 settings a record has dtypes for: False for dtypes up to 32 bits, True for 64-bit ones."""
    if record.wide is not None:
        return [record.wide]
    return sorted({name in WIDE for name in record.dtypes})


# Against an accelerator (``spmdsim conformance --platform gpu``; measured on an NVIDIA H200, jax 0.11.2): what
# differs beyond ACCELERATOR_NORM by design of XLA:GPU or cuSOLVER (spmdsim computes XLA:CPU's results), by test
# id: expected failures there (not strict: another accelerator may agree).
ACCELERATOR_DIFFERENCES = {
    "*-platform_index": "lax.platform_dependent takes the accelerator's branch there; spmdsim computes XLA:CPU's",
    "*-bit-scatter": "updates to one index: XLA:GPU applies them in no fixed order, spmdsim in order as XLA:CPU",
    "*-symmetric_product": "cuBLAS's syrk writes the lower triangle only; spmdsim computes the whole product",
    "*-lu_pivots_to_permutation": "a pivot out of range (3 for size 3): XLA:GPU's kernel treats it otherwise",
    "64-bit-select_and_gather_add": "float64 pairs: JAX packs them through float32 where XLA has no pair "
                                    "reduction (its warning says so); spmdsim keeps float64",
    "*-eigh": "eigenvectors' signs are the solver's choice (cuSOLVER's, not LAPACK's)",
    "*-svd": "singular vectors' signs are the solver's choice (cuSOLVER's, not LAPACK's)",
}


# Records with a case that kills the process on an accelerator, skipped there: XLA:GPU (jaxlib 0.11.2, H200)
# ends with SIGSEGV on these products (each case jitted alone; JAX's bugs, not spmdsim's).
ACCELERATOR_CRASHES = {
    "32-bit-dot_general-preferred": "int8 x int8 with preferred_element_type=float32",
    "32-bit-dot_general-mixed": "bool x bool with preferred_element_type=float32",
    "*-bit-ragged_dot_general": "ragged_dot_general of complex64 and complex128",
    "32-bit-ragged_dot_general-preferred": "int8 ragged_dot_general with preferred_element_type=float32",
}


def param_id(record, wide: bool) -> str:
    return f"{'64-bit' if wide else '32-bit'}-{record.primitive}" + (f"-{record.label}" if record.label else "")


def float32_products():
    """On an accelerator, float32 products and convolutions at JAX's "highest" precision: XLA:GPU's default is
    TF32 (10-bit mantissas; ``jax_default_matmul_precision``), where XLA:CPU and spmdsim compute in float32."""
    return jax.default_matmul_precision("highest") if on_accelerator() else contextlib.nullcontext()


PARAMS = [pytest.param(r, wide, id=param_id(r, wide)) for r in RECORDS for wide in _widths(r)]


@pytest.mark.area("lax primitives vs XLA:CPU")
@pytest.mark.filterwarnings("ignore:Casting complex values to real")
@pytest.mark.parametrize("record, wide", PARAMS)
def test_lax_op(record, wide, record_property, request):
    if on_accelerator():
        for pattern, reason in ACCELERATOR_CRASHES.items():
            if fnmatch.fnmatchcase(param_id(record, wide), pattern):
                pytest.skip(f"XLA:{jax.default_backend()} ends the process with SIGSEGV on {reason}")
        for pattern, reason in ACCELERATOR_DIFFERENCES.items():
            if fnmatch.fnmatchcase(param_id(record, wide), pattern):
                request.applymarker(pytest.mark.xfail(reason=reason, strict=False))
    with jax.enable_x64(wide):
        cases = record.cases(wide, DEVICES)
        assert cases, f"{record.primitive}: JAX rejected every case of this record (check its function and variants)"
        flat = [a for c in cases for a in c.device_args[0]]
        counts = [len(c.device_args[0]) for c in cases]

        def op(*args):
            outs, i = [], 0
            for c, n in zip(cases, counts):
                outs.append(jax.tree_util.tree_leaves(c.fn(*args[i:i + n])))
                i += n
            return outs

        try:
            with float32_products():
                expected = jax.jit(op)(*flat)
        except (NotImplementedError, jax.errors.JaxRuntimeError) as error:
            if not on_accelerator():
                raise
            first = " ".join(line for line in str(error).splitlines()[:3] if line.strip())
            pytest.skip(f"{jax.default_backend()} does not run it: {first}")
        closed = jax.make_jaxpr(op)(*flat)
        out_tree = jax.tree_util.tree_structure(expected)
        actual = jax.tree_util.tree_unflatten(out_tree, sjax.eval_jaxpr(closed.jaxpr, closed.consts, *flat))
        problems, worst = [], {}
        for case, exp, act in zip(cases, expected, actual):
            for k, (e, a) in enumerate(zip(exp, act)):
                e, a = np.asarray(e), np.asarray(a)
                what = f"{case.describe()} output {k}"
                if a.shape != e.shape or a.dtype != e.dtype:
                    problems.append(f"{what}: spmdsim {a.dtype}{list(a.shape)}, XLA {e.dtype}{list(e.shape)}")
                    continue
                if _is_float(e.dtype):
                    distance = ulps(a, e)
                    key = (case.primitive, e.dtype.name)
                    worst[key] = max(worst.get(key, 0.0), distance)
                    allowed = tolerance(case.primitive, e.dtype.name)
                    if isinstance(allowed, tuple):  # ("norm", eps): max |a - e| <= eps * max |e| (finite values)
                        a64, e64 = a.astype(np.complex128), e.astype(np.complex128)
                        same = (a64 == e64) | (np.isnan(a64) & np.isnan(e64))
                        finite = np.isfinite(e64)
                        scale = float(np.max(np.abs(e64[finite]))) if finite.any() else 0.0
                        with np.errstate(invalid="ignore"):  # inf - inf where both are the same infinity
                            error = float(np.max(np.abs(a64 - e64)[~same])) if (~same).any() else 0.0
                        if not error <= allowed[1] * max(scale, 1e-30):
                            problems.append(f"{what}: error {error:g} > {allowed[1]:g} x max|XLA| = {scale:g}")
                        continue
                    if distance > allowed:
                        same = (a == e) | (np.isnan(a.astype(np.complex128)) & np.isnan(e.astype(np.complex128)))
                        bad = np.argwhere(~same) if a.ndim else [()]
                        first = tuple(bad[0]) if len(bad) else ()
                        problems.append(f"{what}: {distance:g} ulps > {allowed:g} allowed (e.g. at {first}: spmdsim "
                                        f"{a[first]!r}, XLA {e[first]!r})")
                elif not np.array_equal(a, e):
                    bad = np.argwhere(a != e) if a.ndim else [()]
                    first = tuple(bad[0]) if len(bad) else ()
                    problems.append(f"{what}: values differ (e.g. at {first}: spmdsim {a[first]!r}, XLA {e[first]!r})")
        # the vectorized rules against the per-device rules, over DEVICES devices
        device_args = [[a for c in cases for a in c.device_args[d]] for d in range(DEVICES)]
        check_vectorized(closed.jaxpr, closed.consts, device_args, problems)
        record_property("lax_ulps", {f"{p}|{d}": u for (p, d), u in worst.items()})
        if problems:
            pytest.fail(f"{record.primitive}: {len(problems)} problem(s)\n" + "\n".join(problems[:40]) +
                        f"\nRepro: pytest 'conformance/test_lax_ops.py::test_lax_op[{'64-bit' if wide else '32-bit'}-"
                        f"{record.primitive}{'-' + record.label if record.label else ''}]'")


@pytest.mark.area("lax primitives vs XLA:CPU")
def test_tolerance_table_names_only_recorded_primitives():
    recorded = {r.primitive for r in RECORDS}
    assert set(p for p, _ in TOLERANCE) <= recorded, set(p for p, _ in TOLERANCE) - recorded


@pytest.mark.area("lax primitives vs XLA:CPU")
def test_vectorized_dot_general_equals_threads_bit_for_bit():
    """Issue 13's case: einsum('scd,dh->sch') (rank 3 x rank 2) on 8 devices, both executors, every bit."""
    import spmdsim

    rng = np.random.default_rng(13)
    x = rng.standard_normal((8, 4, 16, 64)).astype(np.float32)
    w = rng.standard_normal((64, 64)).astype(np.float32)

    def f(block, weights):
        return jax.numpy.einsum("scd,dh->sch", block, weights)

    with spmdsim.set_device_count(8):
        threads = np.asarray(sjax.pmap(f, "i", in_axes=(0, None))(x, w))
        vectorized = np.asarray(sjax.pmap(f, "i", in_axes=(0, None), executor="vectorized")(x, w))
    assert threads.shape == (8, 4, 16, 64) and threads.tobytes() == vectorized.tobytes()
    with float32_products():
        real = np.asarray(jax.jit(jax.vmap(f, in_axes=(0, None)))(x, w))
    allowed = tolerance("dot_general", "float32")
    if isinstance(allowed, tuple):  # an order spmdsim does not model on this CPU: the reordering's bound
        bound = 2 * 63 * 2.0 ** -24 * np.max(np.einsum("iscd,dh->isch", np.abs(x), np.abs(w)))  # k = 64 terms
        assert np.max(np.abs(threads - real)) <= bound
    else:
        assert ulps(threads, real) <= allowed
