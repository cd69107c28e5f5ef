"""XLA:CPU's fused multiply-adds across equations: a jaxpr rewritten before it is evaluated.

XLA:CPU fuses the elementwise operations of a program into loops and compiles them with LLVM allowed to contract
a multiply feeding an add into one fused multiply-add (``fma``: rounded once) where the instruction set has one:
float32 and float64 with FMA (AVX2 and above), float16 with AVX512-FP16, never bfloat16 (:mod:`._xla_cpu_isa`;
measured with jax 0.10.2 and 0.12.0.1: float64 contracts in exactly the patterns float32 does, inside loops too).
A product used only by adds is fused into each of them (of an add of two products, the first operand's; a product
broadcast into the add, of fewer elements, is computed once outside the add's loop and fused into none); a
product that something else uses too (another multiply, the program's output), counting equal products as one
as XLA's common-subexpression elimination does, is computed on its own and fused into none.
``jax.random.uniform(k, shape, minval, maxval)`` computes ``u * (hi - lo) + lo`` this way, and so do flax's
initialisers and every ``x * w + b`` inside a map.

:func:`contract` rewrites a jaxpr the same way: each ``add``, ``add_any`` or ``sub`` of float32, float64 (float16) values
that takes such a ``mul`` (or ``square``) of the same jaxpr becomes one equation of ``xla_cpu_fma`` (the
multiply's operands and the addend), and the multiply's equation goes where nothing else uses it. Both executors
and the reference loop evaluate the rewritten jaxpr (sub-jaxprs are rewritten when they are evaluated), so they
agree with each other bit for bit; the rewrite is made once per jaxpr.

float64's fused multiply-add is :func:`._xla_cpu_math.fma64` (exactly rounded from error-free transformations).
Not modelled (XLA's result can still differ by an ulp there; measured): a product used by two sums that XLA
fuses into one loop (``(p + c) - (p + d)``: XLA then contracts neither), complex128 products (XLA:CPU fuses one
product of each part, as complex64's), products that feed an add through a reshape or from another jaxpr (a ``jit``
call's output: XLA inlines calls), and products inside sums of more than 32 elements or that
:func:`fused_product_sums` leaves alone. A sum of up to 32 products is :func:`fused_product_sums`; it copies the
product into its own loop, as XLA does, so a product that such a sum and an add use is contracted into both.
"""
from __future__ import annotations

import collections

import numpy as np
from spmdsim.jax._internals import core
from spmdsim.jax._internals import weakref_lru_cache

from spmdsim.jax.numerics import _xla_cpu_isa, _xla_cpu_math, _xla_cpu_scalar
from spmdsim.jax.evaluation._registry import per_device, vectorized

__all__ = ["contract", "fma_p"]

fma_p = core.Primitive("xla_cpu_fma")  # never bound: it only appears in jaxprs spmdsim rewrote for itself

_PRODUCTS = ("mul", "square")
_SUMS = ("add", "add_any", "sub")


def _fused_dtypes() -> tuple:
    isa = _xla_cpu_isa.current()
    return tuple(np.dtype(d) for d, fused in ((np.float32, isa.fma), (np.float64, isa.fma), (np.float16, isa.fp16))
                 if fused)


def _plain(eqn) -> bool:
    return all(v is None for k, v in eqn.params.items() if k in ("out_dtype", "accuracy"))


def _key(eqn) -> tuple:
    """Equal products are one product to XLA (its common-subexpression elimination)."""
    return eqn.primitive.name, tuple(v if isinstance(v, core.Var) else (repr(np.asarray(v.val).tolist()), v.aval)
                                     for v in eqn.invars)


def _is_sum(eqn) -> bool:
    return eqn.primitive.name in _SUMS and _plain(eqn)


def _swapped_product(eqn, dot, uses: int):
    """For ``eqn = transpose(dot)`` exchanging the two operands' free axes, of a ``dot_general`` without batch
    axes used nowhere else: the equation ``dot_general(rhs, lhs)`` computing the transposed product directly
    (None otherwise)."""
    if eqn.primitive.name != "transpose" or dot is None or uses != 1:
        return None
    (lhs_c, rhs_c), (lhs_b, rhs_b) = dot.params["dimension_numbers"]
    lhs, rhs = dot.invars
    if lhs_b or rhs_b or lhs.aval.dtype != rhs.aval.dtype:
        return None
    lhs_free, rhs_free = lhs.aval.ndim - len(lhs_c), rhs.aval.ndim - len(rhs_c)
    if tuple(eqn.params["permutation"]) != (*range(lhs_free, lhs_free + rhs_free), *range(lhs_free)):
        return None
    return core.new_jaxpr_eqn([rhs, lhs], eqn.outvars, dot.primitive,
                              {**dot.params, "dimension_numbers": ((rhs_c, lhs_c), ((), ()))},
                              dot.effects, dot.source_info, dot.ctx)


def fold_transposed_products(jaxpr):
    """``transpose(dot_general(a, b))`` as ``dot_general(b, a)``, where the transposition exchanges the product's
    two free blocks (as XLA's algebraic simplifier does): the gradient of ``x @ w`` with respect to ``w`` is such
    a pair. NumPy's transpose is a strided view, and every elementwise operation and collective after it read
    the gradient across pages (8-14x slower on a (1024, 1024) block than in order); BLAS writes the swapped
    product in order instead. The same sums of the same products."""
    producer = {e.outvars[0]: e for e in jaxpr.eqns if e.primitive.name == "dot_general"}
    if not producer:
        return jaxpr
    uses = _uses(jaxpr)
    eqns, folded = [], set()
    for e in jaxpr.eqns:
        operand = e.invars[0] if e.primitive.name == "transpose" and isinstance(e.invars[0], core.Var) else None
        swapped = _swapped_product(e, producer.get(operand), uses.get(operand, 0)) if operand is not None else None
        if swapped is None:
            eqns.append(e)
        else:
            eqns.append(swapped)
            folded.add(operand)
    if not folded:
        return jaxpr
    return jaxpr.replace(eqns=[e for e in eqns if not (e.primitive.name == "dot_general" and e.outvars[0] in folded)])


def contract(jaxpr):
    """``jaxpr`` with XLA:CPU's multiply-add contractions made and transposed products folded (see the module
    docstring and :func:`fold_transposed_products`); ``jaxpr`` itself when there are none."""
    found = _contracted(jaxpr)
    return jaxpr if found is None else found


@weakref_lru_cache
def _contracted(jaxpr):
    """:func:`contract`'s new jaxpr, or None when it is ``jaxpr`` itself: a cached value that is its own weak key
    would keep the jaxpr, and the arrays its equations close over, alive for good (lax_control_flow_test's
    ``test_cond_memory_leak``)."""
    found = _contract(jaxpr)
    return None if found is jaxpr else found


# dtypes whose division by a broadcast or a constant XLA:CPU turns into a multiplication (measured: float32,
# float64, float16; bfloat16's division is computed in float32 and equals one rounding of the quotient)
_RECIPROCAL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))


def _size(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64))


def reciprocal_divisions(jaxpr):
    """``div(x, y)`` as XLA:CPU's algebraic simplifier rewrites it (``xla/hlo/transforms/simplifiers/
    algebraic_simplifier.cc``, HandleDivide), each measured bit for bit with jaxlib 0.10.2, 0.11.2 and 0.12.0.1 in
    the optimized HLO and on every element:

    - ``A / sqrt(B) => A * rsqrt(B)`` and ``A / rsqrt(B) => A * sqrt(B)``, whatever the shapes (``rsqrt`` is then
      XLA:CPU's own, :func:`._xla_cpu_math.rsqrt`; a normalisation ``(x - m) / jnp.sqrt(v + eps)`` is one), where
      nothing else uses the square root (XLA's pattern is ``Sqrt(B).WithOneUse()``; a broadcast of it used once
      counts as the one use): a normalisation's gradient divides by the same square root twice, and XLA then
      divides (``A / Broadcast(B)`` below);
    - ``A / Broadcast(B) => A * Broadcast(1 / B)`` and ``A / Const => A * (1 / Const)``: the reciprocal of the
      broadcast's operand (or of the constant) rounded, then a product. Such a divisor is a literal, a constant
      of the jaxpr, an operand the division itself broadcasts (a smaller shape) or a ``broadcast_in_dim`` of
      fewer elements in the same jaxpr (the optimized HLO of ``x / y``, y of shape (1, 4) and x (16, 4):
      ``divide(1, y)`` of 4 elements, then ``multiply``); never a divisor of the result's own shape computed
      otherwise. ``jax.nn.softmax``'s division by its sums and ``jnp.mean``'s by the count (``sum * (1/3)`` is not
      ``sum / 3``) are such divisions.

    float32, float64 and float16 (float16: the reciprocal rounded to float16, then the product); bfloat16's
    division is left alone (computed in float32, it equals one rounding of the quotient: measured). The product
    is an ordinary multiply to LLVM, so an add it feeds contracts with it (:func:`contract`)."""
    producers = {e.outvars[0]: e for e in jaxpr.eqns if e.primitive.name in ("broadcast_in_dim", "sqrt", "rsqrt")
                 and len(e.outvars) == 1 and isinstance(e.invars[0], core.Var)}
    broadcasts = {v for v, e in producers.items() if e.primitive.name == "broadcast_in_dim"
                  and _size(e.invars[0].aval) < _size(v.aval)}
    constants = set(jaxpr.constvars)
    uses = _uses(jaxpr)
    eqns, changed, spent = [], False, set()
    for e in jaxpr.eqns:
        if e.primitive.name != "div" or e.params or len(e.invars) != 2:
            eqns.append(e)
            continue
        x, y = e.invars
        out = e.outvars[0].aval
        try:
            dtype = np.dtype(out.dtype)
        except TypeError:
            dtype = None
        if dtype not in _RECIPROCAL_DTYPES or np.dtype(y.aval.dtype) != dtype:
            eqns.append(e)
            continue
        spread = producers[y] if isinstance(y, core.Var) and y in broadcasts else None
        source = spread.invars[0] if spread is not None else y
        root = producers.get(source) if isinstance(source, core.Var) else None
        if root is not None and root.primitive.name in ("sqrt", "rsqrt") and _plain(root) \
                and uses.get(source) == 1 and (spread is None or uses.get(y) == 1):
            inverse_p = _RSQRT_P if root.primitive.name == "sqrt" else _SQRT_P
            inverse = core.Var(core.ShapedArray(source.aval.shape, dtype))
            eqns.append(core.new_jaxpr_eqn([root.invars[0]], [inverse], inverse_p, dict(root.params), root.effects,
                                           e.source_info, e.ctx))
        elif isinstance(y, core.Literal) or y in constants or _size(y.aval) < _size(out) or spread is not None:
            one = core.Literal(np.ones((), dtype), core.ShapedArray((), dtype))
            inverse = core.Var(core.ShapedArray(source.aval.shape, dtype))
            eqns.append(core.new_jaxpr_eqn([one, source], [inverse], e.primitive, {}, e.effects, e.source_info,
                                           e.ctx))
        else:
            eqns.append(e)
            continue
        changed = True
        if spread is not None:  # the reciprocal of the broadcast's operand, broadcast as the divisor was
            widened = core.Var(core.ShapedArray(y.aval.shape, dtype))
            eqns.append(core.new_jaxpr_eqn([inverse], [widened], spread.primitive, spread.params, spread.effects,
                                           spread.source_info, spread.ctx))
            inverse = widened
            spent.add(y)
        eqns.append(core.new_jaxpr_eqn([x, inverse], e.outvars, _MUL_P, dict(_MUL_PARAMS), e.effects,
                                       e.source_info, e.ctx))
    if not changed:
        return jaxpr
    used = _used(eqns, jaxpr.outvars)
    return jaxpr.replace(eqns=[e for e in eqns if not (e.outvars and e.outvars[0] in spent
                                                       and e.outvars[0] not in used)])


def _uses(jaxpr) -> collections.Counter:
    """How many times the equations read each variable, the jaxpr's outputs counted as reads."""
    return collections.Counter(v for v in [*(v for e in jaxpr.eqns for v in e.invars), *jaxpr.outvars]
                               if isinstance(v, core.Var))


def _used(eqns, outvars) -> set:
    """The variables that ``eqns`` read or the jaxpr returns (an output may be a literal: not a variable)."""
    return {v for e in eqns for v in e.invars if isinstance(v, core.Var)} | \
        {v for v in outvars if isinstance(v, core.Var)}


_SQUARE_SUM_MAX = 32  # the longest reduction measured to run as one fused loop (33 and more: another order)
_LOOP_ELEMENTS = 4096  # from this many elements jaxlib 0.10 hands a float32 sum to YNNPACK (_reductions)
_LOOP_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # their fused sums measured alike


def _squared(eqn) -> core.Var | None:
    """``p`` where ``eqn`` squares it (``square``, ``mul(p, p)``, ``integer_pow[y=2]``), else None."""
    name = eqn.primitive.name
    p = eqn.invars[0]
    if not isinstance(p, core.Var):
        return None
    if name == "square" and _plain(eqn) or name == "integer_pow" and eqn.params.get("y") == 2:
        return p
    if name == "mul" and _plain(eqn) and eqn.invars[1] is p:
        return p
    return None


def _short_sum(e) -> bool:
    """Whether ``e`` is a float32 ``reduce_sum`` that XLA:CPU runs as one loop of its own (over one axis of 2 to 32
    elements, fewer than 4096 in all): what it reads is fused into it, a copy of what other fusions compute."""
    if e.primitive.name != "reduce_sum" or len(e.invars) != 1 or not isinstance(e.invars[0], core.Var):
        return False
    g, axes = e.invars[0], tuple(e.params.get("axes", ()))
    return len(axes) == 1 and e.params.get("out_sharding") is None and np.dtype(g.aval.dtype) in _LOOP_DTYPES \
        and 2 <= g.aval.shape[axes[0]] <= _SQUARE_SUM_MAX and _size(g.aval) < _LOOP_ELEMENTS


def _product_factors(eqn) -> tuple | None:
    """``(a, b)`` where ``eqn`` multiplies two different values (``mul(a, b)``) of its own rank, each of its shape
    or 1 along some axes (the products :func:`reciprocal_divisions` makes), else None."""
    if eqn.primitive.name != "mul" or not _plain(eqn) or len(eqn.invars) != 2:
        return None
    a, b = eqn.invars
    shape = eqn.outvars[0].aval.shape
    if not (isinstance(a, core.Var) and isinstance(b, core.Var)) or a is b or not all(
            len(v.aval.shape) == len(shape) and all(d in (1, n) for d, n in zip(v.aval.shape, shape)) for v in (a, b)):
        return None
    return a, b


_LOADED = ("dot_general", "conv_general_dilated")  # computed before the sum's loop: read from memory in it
_LAYOUT = ("squeeze", "reshape", "expand_dims", "copy", "copy_p", "pvary")  # no work for XLA (a map's squeeze)


def _returned(jaxpr) -> set:
    """The jaxpr's outputs and what they are layout changes of (a map's body returns ``broadcast_in_dim(x)``)."""
    returned = {v for v in jaxpr.outvars if isinstance(v, core.Var)}
    for e in reversed(jaxpr.eqns):
        if len(e.outvars) == 1 and e.outvars[0] in returned and e.invars and isinstance(e.invars[0], core.Var) \
                and (e.primitive.name in _LAYOUT or e.primitive.name == "broadcast_in_dim"
                     and _size(e.invars[0].aval) == _size(e.outvars[0].aval)):
            returned.add(e.invars[0])
    return returned


def _loaded(v, producers) -> bool:
    """Whether XLA's fused loop reads ``v`` from memory: an input, or computed by an operation it does not fuse
    (``_LOADED``), through layout changes."""
    e = producers.get(v)
    while e is not None and e.primitive.name in _LAYOUT and isinstance(e.invars[0], core.Var):
        e = producers.get(e.invars[0])
    return e is None or e.primitive.name in _LOADED


def _vectorized_plain(e, producers, a, b) -> bool:
    """Whether jaxlib 0.10's LLVM (AMD Zen 4) vectorises the loop of ``reduce_sum(a * b)`` over the outputs and adds
    the products unfused, in order. Measured where the sum is over the last axis and the outputs' last dimension
    (size-1 dimensions dropped) is a multiple of 4 other than 12 (18 and 100 outputs: some of their elements, not
    modelled): for 5 to 8 products of two factors read from memory, not computed in the loop (``a * b``, ``a * a``;
    a broadcast or an elementwise operation of either keeps the loop scalar, and contracted), and for 2 to 8 squares
    of a difference or sum of two such values (``(a - b) ** 2``; ``(a + 1) ** 2`` and ``(x - mean) ** 2`` stay
    scalar). Under the AVX2 cap not for 5 or 7 elements, nor for 8 unless the outputs' last dimension is a multiple
    of 8."""
    g = e.invars[0]
    axis, n = e.params["axes"][0], g.aval.shape[e.params["axes"][0]]
    kept = [d for k, d in enumerate(g.aval.shape) if k != axis and d != 1]
    if _xla_cpu_isa.jaxlib_minor() != (0, 10) or axis != g.aval.ndim - 1 or not kept or kept[-1] % 4 \
            or kept[-1] == 12 or not 2 <= n <= 8:
        return False
    if not _xla_cpu_isa.current().avx512 and (n in (5, 7) or n == 8 and kept[-1] % 8):  # AVX2's vectors: 8 floats
        return False
    if _loaded(a, producers) and _loaded(b, producers):
        return n >= 5
    d = producers.get(a)
    return a is b and d is not None and d.primitive.name in ("sub", "add") and len(d.invars) == 2 and all(
        isinstance(v, core.Var) and v.aval.shape == a.aval.shape and _loaded(v, producers) for v in d.invars)


def fused_product_sums(jaxpr):
    """``reduce_sum`` over one axis of ``n`` (2 to 32) elements of products the program does not return, in float32
    or float64 with FMA: XLA:CPU fuses the products (and what computes them) into the reduction's loop, which adds
    them in order from the init 0, and LLVM contracts each product into the add that takes it. Measured bit for bit
    with jaxlib 0.10.2 and 0.12.0.1 over both axes, lengths 2-32, on AMD Zen 4, both dtypes (33
    elements and more are split otherwise: the products are then computed on their own):

    - a square (``square``, ``mul(p, p)``, ``integer_pow[y=2]``; ``jnp.var``'s ``(x - mean) ** 2``): LLVM folds
      the add of the init 0 away (a square is never -0), so ``s = fma(d0, d0, d1 * d1)``, then ``s = fma(di, di,
      s)`` for i = 2 .. n-1 (the optimized IR: ``fadd reassoc (fmul d0 d0) (fmul d1 d1)``, which the DAG combiner
      fuses at its first operand that is a product);
    - a product of two values ``a * b`` (a normalisation's gradient, ``(x * w).sum(-1)``): ``s = fma(a0, b0, 0)``,
      then ``s = fma(ai, bi, s)`` for i = 1 .. n-1.

    With jaxlib 0.10, over the last axis, where LLVM vectorises the loop over the outputs instead
    (:func:`_vectorized_plain`), the products or squares are added unfused, in order: left as they are.

    A sum of more than 32 products is left as it is. Written as slices and ``xla_cpu_fma`` equations (and one
    product), so every executor computes it with the rules it has."""
    dtypes = [d for d in _LOOP_DTYPES if d in _fused_dtypes()]
    if not dtypes:
        return jaxpr
    producers = {e.outvars[0]: e for e in jaxpr.eqns if len(e.outvars) == 1 and e.invars}
    uses = _uses(jaxpr)
    outputs = _returned(jaxpr)
    eqns, fused = [], set()
    for e in jaxpr.eqns:
        g = e.invars[0] if e.primitive.name == "reduce_sum" and len(e.invars) == 1 else None
        axes = tuple(e.params.get("axes", ()))
        negation = producers.get(g) if isinstance(g, core.Var) and uses.get(g) == 1 else None
        if negation is None or negation.primitive.name != "neg" or not isinstance(negation.invars[0], core.Var):
            negation = None
        m = negation.invars[0] if negation is not None else g
        product = producers.get(m) if isinstance(m, core.Var) and m not in outputs else None
        p = _squared(product) if product is not None else None
        factors = (p, p) if p is not None else _product_factors(product) if product is not None else None
        if factors is None or not _short_sum(e) or np.dtype(g.aval.dtype) not in dtypes \
                or _vectorized_plain(e, producers, *factors):
            eqns.append(e)
            continue
        fused.update((g, m))
        axis, shape, dtype = axes[0], g.aval.shape, np.dtype(g.aval.dtype)
        out_aval = e.outvars[0].aval

        def rows(v):  # v's rows along the axis, squeezed (a factor of 1 row: that row each time)
            out, own = [], v.aval.shape
            for i in range(shape[axis]):
                if own[axis] == 1 and out:
                    out.append(out[0])
                    continue
                start = tuple(i if k == axis else 0 for k in range(len(own)))
                limit = tuple(i + 1 if k == axis else n for k, n in enumerate(own))
                piece = core.Var(core.ShapedArray(tuple(1 if k == axis else n for k, n in enumerate(own)),
                                                  dtype))
                row = core.Var(core.ShapedArray(tuple(n for k, n in enumerate(own) if k != axis), dtype))
                eqns.append(core.new_jaxpr_eqn([v], [piece], _SLICE_P, {"start_indices": start,
                                                                         "limit_indices": limit, "strides": None},
                                               e.effects, e.source_info, e.ctx))
                eqns.append(core.new_jaxpr_eqn([piece], [row], _SQUEEZE_P, {"dimensions": (axis,)}, e.effects,
                                               e.source_info, e.ctx))
                out.append(row)
            return out

        left = rows(factors[0])
        right = left if p is not None else rows(factors[1])
        if p is not None:  # fma(d0, d0, d1 * d1), then the rest
            acc = core.Var(core.ShapedArray(out_aval.shape, dtype))
            eqns.append(core.new_jaxpr_eqn([left[1], left[1]], [acc], _MUL_P, dict(_MUL_PARAMS), e.effects,
                                           e.source_info, e.ctx))
            order = [0] + list(range(2, len(left)))
        else:  # fma(a0, b0, 0), then the rest
            acc = core.Literal(dtype.type(0), core.ShapedArray((), dtype))
            order = list(range(len(left)))
        result = e.outvars[0] if negation is None else core.Var(core.ShapedArray(out_aval.shape, dtype))
        for k in order:
            target = result if k == order[-1] else core.Var(core.ShapedArray(out_aval.shape, dtype))
            eqns.append(core.new_jaxpr_eqn([left[k], right[k], acc], [target], fma_p,
                                           {"negate_product": False, "negate_addend": False}, e.effects,
                                           e.source_info, e.ctx))
            acc = target
        if negation is not None:  # XLA sums the products and negates the sum
            eqns.append(core.new_jaxpr_eqn([result], e.outvars, negation.primitive, negation.params, e.effects,
                                           e.source_info, e.ctx))
    if not fused:
        return jaxpr
    used = _used(eqns, jaxpr.outvars)
    eqns = [e for e in eqns if not (e.outvars and e.outvars[0] in fused and e.outvars[0] not in used)]
    used = _used(eqns, jaxpr.outvars)  # a product only the dropped negation read
    return jaxpr.replace(eqns=[e for e in eqns if not (e.outvars and e.outvars[0] in fused
                                                       and e.outvars[0] not in used)])


def _primitives():
    from jax import lax as jax_lax
    return (jax_lax.mul_p, {"out_dtype": None}, jax_lax.sqrt_p, jax_lax.rsqrt_p,  # mul's parameters: jax 0.10-0.12
            jax_lax.slice_p, jax_lax.squeeze_p)


_MUL_P, _MUL_PARAMS, _SQRT_P, _RSQRT_P, _SLICE_P, _SQUEEZE_P = _primitives()


def _contract(jaxpr):
    jaxpr = fold_transposed_products(jaxpr)
    jaxpr = fused_product_sums(reciprocal_divisions(jaxpr))
    dtypes = _fused_dtypes()
    if not dtypes or not any(e.primitive.name in _PRODUCTS for e in jaxpr.eqns):
        return jaxpr
    products = {e.outvars[0]: e for e in jaxpr.eqns
                if e.primitive.name in _PRODUCTS and _plain(e) and np.dtype(e.outvars[0].aval.dtype) in dtypes}
    # a product that anything but a sum uses (or the jaxpr returns) is computed as it is, and no sum fuses it; a
    # reduction is a fusion of its own, into which XLA copies the product (fused_product_sums): it does not count
    kept = {_key(products[v]) for e in jaxpr.eqns if not _is_sum(e) and not _short_sum(e)
            for v in e.invars if isinstance(v, core.Var) and v in products}
    kept.update(_key(products[v]) for v in jaxpr.outvars if isinstance(v, core.Var) and v in products)
    fusible = {v for v, e in products.items() if _key(e) not in kept}
    eqns, fused = [], set()
    for e in jaxpr.eqns:
        # a product of fewer elements than the sum (broadcast into it: ``x - mean(x, keepdims=True)``'s mean) is
        # computed once, outside the sum's loop, and contracted into nothing (measured, jaxlib 0.10.2)
        position = next((k for k, v in enumerate(e.invars) if isinstance(v, core.Var) and v in fusible
                         and v.aval.shape == e.outvars[0].aval.shape), None) if _is_sum(e) else None
        if position is None:
            eqns.append(e)
            continue
        product = products[e.invars[position]]
        fused.add(product.outvars[0])
        a, b = product.invars * 2 if product.primitive.name == "square" else product.invars
        sub = e.primitive.name == "sub"
        eqns.append(core.new_jaxpr_eqn(
            [a, b, e.invars[1 - position]], e.outvars, fma_p,
            {"negate_product": sub and position == 1, "negate_addend": sub and position == 0},
            e.effects, e.source_info, e.ctx))
    if not fused:
        return jaxpr
    used = {v for e in eqns for v in e.invars if isinstance(v, core.Var)}
    return jaxpr.replace(eqns=[e for e in eqns if not (e.outvars and e.outvars[0] in fused
                                                       and e.outvars[0] not in used)])


@per_device("xla_cpu_fma")
def _fma(a, b, c, *, negate_product: bool, negate_addend: bool, out=None):
    """``±a * b ± c`` rounded once, in the operands' dtype: float64 by :func:`._xla_cpu_math.fma64` (exact);
    float32 or float16 through float64, where the product of two such values is exact, and so is the sum of
    float16 values; a float32 sum is rounded to float64 first, which differs from one rounding in about one case
    in 2**29 (as :func:`._xla_cpu_math.fma`). ``out``: an array of the result's shape and dtype to write into,
    possibly an operand (``_compiled`` gives one that dies here)."""
    if out is None and all(getattr(x, "ndim", None) == 0 and x.dtype == np.float32 for x in (a, b, c)):
        value = _xla_cpu_scalar.fma(float(a), float(b), float(c), negate_product, negate_addend)
        if value is not None:  # one value (a sampler's scalars): in Python floats, the same bits
            return np.array(value, np.float32)
    dtype = np.result_type(a, b, c)
    if dtype == np.float64:
        return _xla_cpu_math.fma64(a, b, c, negate_product=negate_product, negate_addend=negate_addend, out=out)
    return _xla_cpu_math.rounded_once(a, b, c, np.result_type(a, b, c), negate_product=negate_product,
                                      negate_addend=negate_addend, out=out)


@vectorized("xla_cpu_fma")
def _stacked_fma(a, b, c, **params):
    """:func:`_fma` on operands stacked on a device axis (a per-device scalar ``(n,)`` broadcast as ``(n, 1...)``)."""
    ndim = max(np.ndim(a), np.ndim(b), np.ndim(c))
    return _fma(*(np.reshape(x, np.shape(x) + (1,) * (ndim - np.ndim(x))) for x in (a, b, c)), **params)
