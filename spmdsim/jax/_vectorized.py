"""The vectorized executor: each equation evaluated once over every device's block, stacked on a leading
device axis, in the caller's thread. For thousands of devices, where one thread per device is slow.

- Primitives with axis parameters have batched rules here (the axes shifted by one); elementwise primitives
  use their per-device rules unchanged (the device axis broadcasts); the rest (gather, scatter, dynamic
  slices, random bits, ...) fall back to a loop over the devices with their per-device rules.
- Collectives apply the same rule table (:mod:`spmdsim._collectives`) along the device axis, so results are
  those of the thread executor bit for bit (same reduction order).
- ``cond`` and ``while`` split the devices by their own predicate. A collective that only some devices
  would reach is the program that hangs on hardware: it raises CollectiveDeadlockError here too (run the
  thread executor, the default, for the full per-device report).

The thread executor stays the reference; the conformance suite runs the JAX front end both ways.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Callable

import numpy as np
from jax.extend import core as ext_core

from spmdsim import _collectives
from spmdsim.errors import CollectiveDeadlockError
from spmdsim.jax._collective_rules import REDUCTIONS, collective_call, positional_reduce, split_axes
from spmdsim.lax import _axis_names
from spmdsim.jax._dtypes import numpy_shape_dtype
from spmdsim.jax._interpreter import IMPL, _read_literal, split_closed
from spmdsim.jax._registry import VECTORIZED

__all__ = ["eval_jaxpr_batched", "BATCHED"]

BATCHED: dict[str, Callable] = {}
COLLECTIVES = {"psum", "pmax", "pmin", "all_gather", "reduce_scatter", "all_to_all", "ppermute", "pbroadcast",
               "axis_index"}


@dataclasses.dataclass(frozen=True)
class Devices:
    """The devices in the current batch (``ids``, axis indices) out of ``size`` along the named axis."""

    name: object
    size: int
    ids: np.ndarray

    @property
    def complete(self) -> bool:
        return len(self.ids) == self.size

    def subset(self, mask: np.ndarray) -> "Devices":
        return Devices(self.name, self.size, self.ids[mask])


def batched(*names: str):
    def register(rule):
        for name in names:
            BATCHED[name] = rule
        return rule
    return register


class _Step:
    """One equation prepared once per jaxpr: its batched rule, operands, and the result avals."""

    __slots__ = ("eqn", "rule", "operands", "outvars", "expected", "multiple", "_literals")

    def __init__(self, eqn):
        self.eqn = eqn
        self.rule = BATCHED.get(eqn.primitive.name)
        if eqn.primitive.name in VECTORIZED and eqn.invars:  # VECTORIZED first (nullary rules: size-1 axis)
            rule = VECTORIZED[eqn.primitive.name]
            self.rule = lambda devices, *xs, **params: rule(*xs, **params)
        self.operands = [(True, _read_literal(v)) if isinstance(v, ext_core.Literal) else (False, v)
                         for v in eqn.invars]
        self.outvars = [None if isinstance(v, ext_core.DropVar) else v for v in eqn.outvars]
        self.expected = [numpy_shape_dtype(v.aval) for v in eqn.outvars]
        self.multiple = eqn.primitive.multiple_results
        self._literals: tuple = (None, ())

    def inputs(self, env: dict, n: int) -> list:
        """The operands for ``n`` devices: variables from ``env``, literals broadcast (once per ``n``)."""
        cached_n, literals = self._literals
        if cached_n != n:
            literals = [np.broadcast_to(value, (n, *value.shape)) if literal else None
                        for literal, value in self.operands]
            self._literals = (n, literals)
        return [env[value] if lit is None else lit for lit, (_, value) in zip(literals, self.operands)]


_programs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def eval_jaxpr_batched(jaxpr, consts, args, devices: Devices) -> list[np.ndarray]:
    """Evaluate ``jaxpr`` once for all of ``devices``: every argument and result has the device axis first."""
    n = len(devices.ids)
    program = _programs.get(jaxpr)
    if program is None:
        program = _programs[jaxpr] = [_Step(eqn) for eqn in jaxpr.eqns]
    env: dict = {}
    for v, c in zip(jaxpr.constvars, consts):
        c = np.asarray(c)
        env[v] = np.broadcast_to(c, (n, *c.shape))
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    with np.errstate(all="ignore"):
        for step in program:
            invals = step.inputs(env, n)
            if step.rule is not None:
                out = step.rule(devices, *invals, **step.eqn.params)
            else:
                out = _per_device(step.eqn, invals, n)
            for var, val, (shape, dtype) in zip(step.outvars, out if step.multiple else (out,), step.expected):
                if type(val) is not np.ndarray:
                    val = np.asarray(val)
                if val.shape != (n, *shape) or val.dtype != dtype:
                    raise AssertionError(f"spmdsim bug: the vectorized rule for {step.eqn.primitive.name!r} returned "
                                         f"{val.dtype}{list(val.shape)}, expected {dtype}{[n, *shape]}.")
                if var is not None:
                    env[var] = val
    return [np.broadcast_to(_read_literal(v), (n, *v.aval.shape)) if isinstance(v, ext_core.Literal) else env[v]
            for v in jaxpr.outvars]


def _per_device(eqn, invals, n):
    """The fallback: the per-device rule once per device, results stacked."""
    name = eqn.primitive.name
    rule = IMPL.get(name)
    if rule is None or name in COLLECTIVES:
        raise NotImplementedError(f"the vectorized executor has no rule for primitive {name!r}; use the thread "
                                  f"executor (the default).")
    outs = [rule(*(x[d] for x in invals), **eqn.params) for d in range(n)]
    if eqn.primitive.multiple_results:
        return [np.stack([np.asarray(o[k]) for o in outs]) for k in range(len(eqn.outvars))]
    return np.stack([np.asarray(o) for o in outs])


def _call(devices, jaxpr, args):
    inner, consts = split_closed(jaxpr)
    return eval_jaxpr_batched(inner, consts, list(args), devices)


# -- elementwise: the per-device rules work on stacked blocks as they are ---------------------------------

_ELEMENTWISE = ["neg", "sign", "floor", "ceil", "is_finite", "exp", "exp2", "log", "log1p", "expm1", "tanh", "sin",
                "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt", "cbrt", "abs",
                "real", "imag", "conj", "square", "rsqrt", "logistic", "add", "add_any", "sub", "mul", "max", "min",
                "atan2", "nextafter", "rem", "and", "or", "xor", "eq", "ne", "lt", "le", "gt", "ge", "not", "div",
                "pow", "integer_pow", "round", "erf", "erfc", "lgamma", "erf_inv", "population_count", "shift_left",
                "shift_right_logical", "shift_right_arithmetic", "complex", "convert_element_type",
                "reduce_precision", "copy", "copy_p", "pvary", "sharding_constraint", "pcast", "stop_gradient"]
def _expand_to(x: np.ndarray, ndim: int) -> np.ndarray:
    """A per-device scalar (shape (n,)) as (n, 1, ..., 1) so it broadcasts against rank ``ndim`` blocks."""
    return x.reshape(x.shape + (1,) * (ndim - x.ndim))


def _elementwise(rule):
    def batched_rule(devices, *args, **params):
        ndim = max(a.ndim for a in args)
        return rule(*(_expand_to(a, ndim) for a in args), **params)
    return batched_rule


for _name in _ELEMENTWISE:
    BATCHED[_name] = _elementwise(IMPL[_name])


@batched("select_n")
def _select_n(devices, which, *cases):
    ndim = max(c.ndim for c in cases)
    return IMPL["select_n"](_expand_to(which, ndim), *(_expand_to(c, ndim) for c in cases))


@batched("clamp")
def _clamp(devices, lo, x, hi):
    return IMPL["clamp"](_expand_to(lo, x.ndim), x, _expand_to(hi, x.ndim))


# -- shapes: the same operations with the device axis in front ---------------------------------------------

def _shift(axes) -> tuple:
    return tuple(a + 1 for a in axes)


@batched("broadcast_in_dim")
def _broadcast_in_dim(devices, x, *dyn, shape, broadcast_dimensions, sharding=None):
    return IMPL["broadcast_in_dim"](x, shape=(len(devices.ids), *shape), broadcast_dimensions=(0, *_shift(broadcast_dimensions)))


@batched("reshape")
def _reshape(devices, x, *dyn, new_sizes, dimensions=None, sharding=None):
    if dimensions is not None:
        x = np.transpose(x, (0, *_shift(dimensions)))
    return x.reshape((x.shape[0], *new_sizes))


@batched("squeeze")
def _squeeze(devices, x, *, dimensions):
    return np.squeeze(x, axis=_shift(dimensions))


@batched("expand_dims")
def _expand_dims(devices, x, *, dimensions):
    return np.expand_dims(x, _shift(dimensions))


@batched("transpose")
def _transpose(devices, x, *, permutation):
    return np.transpose(x, (0, *_shift(permutation)))


@batched("rev")
def _rev(devices, x, *, dimensions):
    return np.flip(x, _shift(dimensions)) if dimensions else x


@batched("concatenate")
def _concatenate(devices, *xs, dimension):
    return np.concatenate(xs, axis=dimension + 1)


@batched("split")
def _split(devices, x, *, sizes, axis):
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis + 1)


@batched("stack")
def _stack(devices, *xs, axis):
    return np.stack(xs, axis=axis + 1)


@batched("slice")
def _slice(devices, x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * (x.ndim - 1)
    return x[(slice(None), *(slice(s, l, st) for s, l, st in zip(start_indices, limit_indices, strides)))]


@batched("iota")
def _iota(devices, *dyn, dtype, shape, dimension, sharding=None):
    one = IMPL["iota"](dtype=dtype, shape=shape, dimension=dimension)
    return np.broadcast_to(one, (len(devices.ids), *shape))


def _reduction(name):
    rule = IMPL[name]
    return lambda devices, x, *, axes, out_sharding=None: rule(x, axes=_shift(axes))


for _name in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "reduce_and", "reduce_or", "reduce_xor"):
    BATCHED[_name] = _reduction(_name)


BATCHED["argmax"] = lambda devices, x, *, axes, index_dtype: np.argmax(x, axis=axes[0] + 1).astype(index_dtype)
BATCHED["argmin"] = lambda devices, x, *, axes, index_dtype: np.argmin(x, axis=axes[0] + 1).astype(index_dtype)

for _name in ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"):
    BATCHED[_name] = (lambda rule: lambda devices, x, *, axis, reverse: rule(x, axis=axis + 1, reverse=reverse))(IMPL[_name])


@batched("dot_general")
def _dot_general(devices, lhs, rhs, *, dimension_numbers, **params):
    (lc, rc), (lb, rb) = dimension_numbers
    return IMPL["dot_general"](lhs, rhs, dimension_numbers=((_shift(lc), _shift(rc)), ((0, *_shift(lb)), (0, *_shift(rb)))),
                               **params)


@batched("sort")
def _sort(devices, *operands, dimension, is_stable, num_keys):
    return IMPL["sort"](*operands, dimension=dimension + 1, is_stable=is_stable, num_keys=num_keys)


# -- higher order ------------------------------------------------------------------------------------------

@batched("pjit", "jit")
def _pjit(devices, *args, jaxpr, **_):
    return _call(devices, jaxpr, args)


@batched("closed_call", "core_call")
def _closed_call(devices, *args, call_jaxpr, **_):
    return _call(devices, call_jaxpr, args)


@batched("remat2", "checkpoint", "remat")
def _remat(devices, *args, jaxpr, **_):
    return _call(devices, jaxpr, args)


@batched("custom_jvp_call")
def _custom_jvp_call(devices, *args, call_jaxpr, **_):
    return _call(devices, call_jaxpr, args)


@batched("custom_vjp_call", "custom_vjp_call_jaxpr")
def _custom_vjp_call(devices, *args, **params):
    return _call(devices, params.get("call_jaxpr") or params.get("fun_jaxpr"), args)


def _has_collectives(jaxpr) -> bool:
    inner, _ = split_closed(jaxpr)
    for eqn in inner.eqns:
        if eqn.primitive.name in COLLECTIVES - {"axis_index"}:
            return True
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
                    if _has_collectives(sub):
                        return True
    return False


def _on_subset(devices: Devices, mask: np.ndarray, jaxpr, args, what: str) -> list[np.ndarray]:
    """Evaluate ``jaxpr`` for the devices in ``mask`` only (the others do not execute it)."""
    if not mask.all() and _has_collectives(jaxpr):
        who = ", ".join(str(int(i)) for i in devices.ids[mask])
        raise CollectiveDeadlockError(
            f"{what} that contains a collective is executed by devices {who} only (of {devices.size} on axis "
            f"{devices.name!r}): on real hardware this program hangs. Run it with the thread executor (the default) "
            f"for the per-device report.")
    return _call(devices.subset(mask), jaxpr, [a[mask] for a in args])


@batched("cond")
def _cond(devices, index, *operands, branches, **_):
    index = np.clip(np.asarray(index).astype(np.int64), 0, len(branches) - 1)
    outs = None
    for b in np.unique(index):
        mask = index == b
        part = _on_subset(devices, mask, branches[b], operands, "a cond branch")
        if outs is None:
            outs = [np.empty((len(index), *p.shape[1:]), dtype=p.dtype) for p in part]
        for o, p in zip(outs, part):
            o[mask] = p
    return outs


@batched("while")
def _while(devices, *args, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    cond_consts, body_consts = args[:cond_nconsts], args[cond_nconsts:cond_nconsts + body_nconsts]
    carry = [np.array(c) for c in args[cond_nconsts + body_nconsts:]]
    while True:
        active = np.asarray(_call(devices, cond_jaxpr, [*cond_consts, *carry])[0]).astype(bool)
        if not active.any():
            return carry
        new = _on_subset(devices, active, body_jaxpr, [*body_consts, *carry], "a while loop body")
        for c, v in zip(carry, new):
            c[active] = v


@batched("scan")
def _scan(devices, *args, jaxpr, num_consts, num_carry, length, reverse, **_):
    consts, carry = args[:num_consts], list(args[num_consts:num_consts + num_carry])
    xs = args[num_consts + num_carry:]
    n = len(devices.ids)
    ys = [np.empty((n, length, *numpy_shape_dtype(a)[0]), dtype=numpy_shape_dtype(a)[1])
          for a in jaxpr.out_avals[num_carry:]]
    for step in range(length):
        i = length - 1 - step if reverse else step
        outs = _call(devices, jaxpr, [*consts, *carry, *(x[:, i] for x in xs)])
        carry = outs[:num_carry]
        for y, out in zip(ys, outs[num_carry:]):
            y[:, i] = out
    return carry + ys


# -- collectives along the device axis, through the same rule table -----------------------------------------

def _batched_collective(prim: str):
    def rule(devices: Devices, x, **params):
        if prim in REDUCTIONS:
            x = positional_reduce(prim, x, params["axes"], shift=1)
        names = split_axes(params)[0]
        if not names:
            return x
        if len(set(names)) != len(names):
            raise ValueError(f"{prim}: repeated axis in `source` argument: {names!r}. Name each axis once.")
        if names != (devices.name,):
            raise NotImplementedError(f"the vectorized executor maps one named axis ({devices.name!r}); {prim} "
                                      f"over {names} needs the thread executor.")
        call = collective_call(prim, x[0], devices.size, params)
        if call is None:
            return x
        if not devices.complete:
            raise CollectiveDeadlockError(f"{prim} over {devices.name!r} reached by devices "
                                          f"{', '.join(map(str, devices.ids))} only: on real hardware this hangs.")
        results = _collectives.apply_grouped(call.rule, [[b] for b in x], call.groups, **call.params)
        first = results[0][0]
        if all(r[0] is first for r in results):  # the same value everywhere (psum, all_gather, ...): no copies
            return np.broadcast_to(first, (len(results), *first.shape))
        return np.stack([r[0] for r in results])
    return rule


for _prim in ("psum", "pmax", "pmin", "all_gather", "reduce_scatter", "all_to_all", "ppermute", "pbroadcast"):
    BATCHED[_prim] = _batched_collective(_prim)


@batched("axis_index")
def _axis_index(devices, *, axis_name):
    if _axis_names(axis_name) != (devices.name,):
        raise NotImplementedError(f"the vectorized executor maps one named axis ({devices.name!r}).")
    return devices.ids.astype(np.int32)
