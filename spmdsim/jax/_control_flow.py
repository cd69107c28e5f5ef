"""Higher-order primitives, evaluated recursively: calls, custom derivatives, remat, cond, while, scan.

``cond`` and ``while`` run on each device's concrete predicate, so devices may take different branches or
iterate a different number of times. A collective inside such a branch is exactly the program that hangs
on real hardware; the runtime reports it (CollectiveDeadlockError / CollectiveMismatchError).
"""
from __future__ import annotations

import numpy as np

from spmdsim.jax._dtypes import numpy_shape_dtype
from spmdsim.jax._interpreter import eval_closed_jaxpr, eval_jaxpr, impl, split_closed


def _call(jaxpr, args):
    inner, consts = split_closed(jaxpr)
    return eval_jaxpr(inner, consts, *args)


@impl("pjit", "jit")
def _pjit(*args, jaxpr, **_):
    return _call(jaxpr, args)


@impl("closed_call", "core_call")
def _closed_call(*args, call_jaxpr, **_):
    return _call(call_jaxpr, args)


@impl("remat2", "checkpoint", "remat")
def _remat(*args, jaxpr, **_):
    return _call(jaxpr, args)


@impl("custom_jvp_call")
def _custom_jvp_call(*args, call_jaxpr, num_consts=0, **_):
    return _call(call_jaxpr, args)


@impl("custom_vjp_call", "custom_vjp_call_jaxpr")
def _custom_vjp_call(*args, **params):
    jaxpr = params.get("call_jaxpr") or params.get("fun_jaxpr")
    return _call(jaxpr, args)


@impl("cond")
def _cond(index, *operands, branches, **_):
    i = int(np.clip(int(index), 0, len(branches) - 1))
    return eval_closed_jaxpr(branches[i], *operands)


@impl("while")
def _while(*args, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    cond_consts, body_consts = args[:cond_nconsts], args[cond_nconsts:cond_nconsts + body_nconsts]
    carry = list(args[cond_nconsts + body_nconsts:])
    while bool(eval_closed_jaxpr(cond_jaxpr, *cond_consts, *carry)[0]):
        carry = eval_closed_jaxpr(body_jaxpr, *body_consts, *carry)
    return carry


@impl("scan")
def _scan(*args, jaxpr, num_consts, num_carry, length, reverse, **_):
    consts, carry, xs = args[:num_consts], list(args[num_consts:num_consts + num_carry]), args[num_consts + num_carry:]
    y_avals = jaxpr.out_avals[num_carry:]
    ys = [np.empty((length, *numpy_shape_dtype(a)[0]), dtype=numpy_shape_dtype(a)[1]) for a in y_avals]
    for step in range(length):
        i = length - 1 - step if reverse else step
        outs = eval_closed_jaxpr(jaxpr, *consts, *carry, *(x[i] for x in xs))
        carry = outs[:num_carry]
        for y, out in zip(ys, outs[num_carry:]):
            y[i] = out
    return carry + ys
