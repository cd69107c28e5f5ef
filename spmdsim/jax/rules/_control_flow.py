"""Higher-order primitives, written once for both executors: calls, custom derivatives, remat, cond, while,
scan. Each rule receives the :class:`~spmdsim.jax.evaluation._interpreter.Executor` and evaluates its sub-jaxprs with it.

``cond`` and ``while`` follow each device's own predicate, so devices may take different branches or iterate
a different number of times (the thread executor runs each device's branch; the vectorized executor splits
the devices by branch). A collective inside such a branch is exactly the program that hangs on real hardware:
both executors report it. The thread executor's rendezvous sees it; in the vectorized executor a collective
that a subset of devices reaches raises :class:`~spmdsim.primitives._batch.Diverged`, and the rule that split the
devices reports it with what the other devices did (:meth:`Executor.diverged`).
"""
from __future__ import annotations

import numpy as np

from spmdsim.primitives._batch import Diverged
from spmdsim.jax.evaluation._dtypes import is_token
from spmdsim.jax.evaluation._interpreter import Executor, current_site, eqn_stack, higher_order
from spmdsim.jax.evaluation._lowered import lowering_jaxpr
from spmdsim.jax.rules._lanes import compacted_while
from spmdsim.jax._internals import scan_counts


# The call primitives whose rule below is ``ex.eval_closed(params[key], operands)``, and that key (compiled
# programs call these sub-jaxprs directly: ``_compiled._SubCall``).
CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
         "call": "call_jaxpr", "eval_jaxpr": "call_jaxpr", "custom_jvp_call": "call_jaxpr", "remat2": "jaxpr",
         "checkpoint": "jaxpr", "remat": "jaxpr"}


@higher_order("pjit", "jit")
def _pjit(ex: Executor, *args, jaxpr, **_params):
    return ex.eval_closed(jaxpr, args)


@higher_order("closed_call", "core_call", "call", "eval_jaxpr")
def _closed_call(ex: Executor, *args, call_jaxpr, **_params):
    """JAX's generic calls (``core.call_p``; from JAX 0.12 the primitive ``eval_jaxpr``, which it is an alias
    of): the sub-jaxpr."""
    return ex.eval_closed(call_jaxpr, args)


@higher_order("composite")
def _composite(ex: Executor, *args, **params):
    """``lax.composite``: XLA:CPU runs the decomposition (``jaxpr``; ``call_jaxpr`` from JAX 0.12), so does
    spmdsim."""
    return ex.eval_closed(params["call_jaxpr" if "call_jaxpr" in params else "jaxpr"], args)


@higher_order("call_hi_primitive")
def _call_hi_primitive(ex: Executor, *args, **_params):
    """A JAX 0.12 "hi" primitive (``jnp.searchsorted(method='scan')``): the lo-primitive program JAX expands it
    into before lowering (its ``to_lojax``, see :mod:`._lowered`)."""
    return ex.eval_closed(lowering_jaxpr(eqn_stack()[-1]), args)


@higher_order("custom_partitioning")
def _custom_partitioning(ex: Executor, *args, call, **_params):
    """``jax.experimental.custom_partitioning``: the function itself (``call``, on the values spmdsim holds: global
    outside a map, a device's block inside one), which its ``partition`` rule promises to compute by parts; XLA
    runs ``call`` too where it does not partition (one device, a manual map's body)."""
    return ex.eval_closed(call, args)


@higher_order("remat2", "checkpoint", "remat")
def _remat(ex: Executor, *args, jaxpr, **_params):
    return ex.eval_closed(jaxpr, args)


@higher_order("custom_jvp_call")
def _custom_jvp_call(ex: Executor, *args, call_jaxpr, **_params):
    return ex.eval_closed(call_jaxpr, args)


@higher_order("custom_vjp_call", "custom_vjp_call_jaxpr")
def _custom_vjp_call(ex: Executor, *args, **params):
    return ex.eval_closed(params.get("call_jaxpr") or params.get("fun_jaxpr"), args)


@higher_order("cond")
def _cond(ex: Executor, index, *operands, branches, **_params):
    outs, waiting, went_on = None, [], []
    for branch, selection in ex.partition(index, len(branches)):
        try:
            part = ex.subset(selection).eval_closed(branches[branch], [ex.select(x, selection) for x in operands])
        except Diverged as d:
            if selection is None:  # every device here took this branch: the split is further out
                raise
            waiting += d.calls
            continue
        went_on.append((selection, branch))
        outs = ex.merge(outs, part, selection)
    if waiting:
        site = current_site()
        names = [f"branch {b}" + (f" ({'true' if b else 'false'}_fun)" if len(branches) == 2 else "")
                 for b in range(len(branches))]
        ex.diverged(waiting, [(selection, f"took {names[b]} of the cond at {site} and went on")
                              for selection, b in went_on], f"in the branches of the cond at {site}")
    return outs


@higher_order("while")
def _while(ex: Executor, *args, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    """A predicate of shape ``()`` per device: each device iterates while its own is true. A batched predicate
    (``vmap`` of a ``while_loop`` whose condition depends on the batched carry) is lowered by JAX as XLA runs
    it: the loop goes on while any element is true, and each iteration keeps the body's result only where the
    predicate (evaluated on the carry before the body, broadcast over the carry's trailing axes) is true."""
    cond_consts, body_consts = args[:cond_nconsts], args[cond_nconsts:cond_nconsts + body_nconsts]
    carry = list(args[cond_nconsts + body_nconsts:])
    batched = len(cond_jaxpr.out_avals[0].shape)  # the predicate's own axes (after a device axis, if any)
    if not batched and ex.kind == "vectorized" and ex.compiled:  # the same values, less bookkeeping (see ._lanes)
        return compacted_while(ex, cond_jaxpr, body_jaxpr, list(cond_consts), list(body_consts), carry)
    tokens = [is_token(aval) for aval in body_jaxpr.out_avals]
    while True:
        pred = ex.eval_closed(cond_jaxpr, [*cond_consts, *carry])[0]
        any_true = np.any(pred, axis=tuple(range(pred.ndim - batched, pred.ndim))) if batched else pred
        parts = ex.partition(any_true, 2)
        going = [selection for keep, selection in parts if keep]
        if not going:
            return carry
        selection = going[0]
        sub = ex.subset(selection)
        old = [ex.select(x, selection) for x in carry]
        arguments = [*(ex.select(x, selection) for x in body_consts), *old]
        owned = selection is None and not batched  # the carry is the body's alone: updated in place where it can be
        if owned:
            carry = old = new = None
        try:
            new = sub.eval_closed(body_jaxpr, arguments, consume=owned)
        except Diverged as d:
            if selection is None:
                raise
            ex.diverged(d.calls, [(stopped, f"left the while loop at {current_site()}") for keep, stopped in parts
                                  if not keep], f"in the while loop at {current_site()}")
        if batched:
            keep = ex.select(pred, selection)
            new = [n if token else np.where(keep.reshape(keep.shape + (1,) * (np.ndim(n) - keep.ndim)), n, o)
                   for n, o, token in zip(new, old, tokens, strict=True)]
        carry = ex.merge(carry, new, selection)


@higher_order("scan")
def _scan(ex: Executor, *args, jaxpr, length, reverse, **params):
    num_consts, num_carry = scan_counts(params)
    consts, carry = args[:num_consts], list(args[num_consts:num_consts + num_carry])
    xs = args[num_consts + num_carry:]
    ys = [ex.stacked_buffer(aval, length) for aval in jaxpr.out_avals[num_carry:]]
    for step in range(length):
        i = length - 1 - step if reverse else step
        arguments = [*consts, *carry, *(ex.scanned(x, i) for x in xs)]
        carry = None  # the body holds the carry alone: updated in place where it can be (see ._compiled)
        outs = ex.eval_closed(jaxpr, arguments, consume=True)
        for y, out in zip(ys, outs[num_carry:], strict=True):
            ex.put_scanned(y, i, out)
        carry, outs = outs[:num_carry], None
    return carry + ys
