"""The vectorized executor's ``while`` loop whose devices leave it at different iterations (issue 43).

The loop of :func:`._control_flow._while` is the definition: every iteration it evaluates the predicate on every
device's carry, takes the devices still going (``ex.select``), runs the body on them and puts their new carry
back among the others' (``ex.merge``). Devices that leave a loop early (chains of an MCMC sampler leaving a
tree-building loop at different depths) then cost a selection and a merge of the whole carry at every later
iteration, and a predicate evaluated on devices that already left.

:func:`compacted_while` computes the same values with less bookkeeping: the carry of the devices still in the
loop is kept on its own, compacted (its leading axis holds only those devices); a device's final carry is
written into the result once, at the iteration it leaves; the predicate and the body are evaluated on the
devices in the loop only, by the compiled program for their count (:mod:`spmdsim.jax.compiled._compiled`). Each
device's values are those of the definition: vectorized rules compute each device's block from that device's
operands alone, whichever devices are evaluated together. A collective reached by some devices only is reported as the
definition reports it (:meth:`Executor.diverged`), the devices that left named as having left the loop.
"""
from __future__ import annotations

import numpy as np

from spmdsim.primitives._batch import Diverged
from spmdsim.jax.evaluation._dtypes import is_token
from spmdsim.jax.evaluation._interpreter import Executor, current_site

__all__ = ["compacted_while"]


def compacted_while(ex: Executor, cond_jaxpr, body_jaxpr, cond_consts: list, body_consts: list,
                    carry: list) -> list:
    """``while cond(carry): carry = body(carry)`` per device of the vectorized executor ``ex`` (a predicate of
    shape ``()`` per device), as :func:`._control_flow._while` computes it."""
    n = ex.n
    tokens = [is_token(aval) for aval in body_jaxpr.out_avals]
    lanes: np.ndarray | None = None  # positions (in ex's devices) of the devices in the loop; None: all of them
    sub = ex
    results: list | None = None  # the carry of every device, filled in as devices leave (once one has)
    while True:
        try:
            pred = np.asarray(sub.eval_closed(cond_jaxpr, [*cond_consts, *carry])[0])
        except Diverged as d:
            _report(ex, d, lanes)
        going = pred.all()
        if not going:
            keep = pred.astype(bool)
            leaving = np.flatnonzero(~keep)
            where = leaving if lanes is None else lanes[leaving]
            if results is None:
                results = [x if token else np.empty((n, *np.shape(x)[1:]), np.asarray(x).dtype)
                           for x, token in zip(carry, tokens, strict=True)]
            for k, token in enumerate(tokens):
                if token:
                    results[k] = carry[k]
                else:
                    results[k][where] = carry[k][leaving]
            if not keep.any():
                return results
            staying = np.flatnonzero(keep)
            lanes = staying if lanes is None else lanes[staying]
            carry = [x if token else x[staying] for x, token in zip(carry, tokens, strict=True)]
            cond_consts = [x[staying] for x in cond_consts]
            body_consts = [x[staying] for x in body_consts]
            mask = np.zeros(n, bool)
            mask[lanes] = True
            sub = ex.subset(mask)
        arguments = [*body_consts, *carry]
        carry = None  # the body holds the carry alone: updated in place where it can be (see ._compiled)
        try:
            carry = sub.eval_closed(body_jaxpr, arguments, consume=True)
        except Diverged as d:
            _report(ex, d, lanes)


def _report(ex: Executor, d: Diverged, lanes: np.ndarray | None):
    """A collective reached by the devices ``lanes`` still in the loop only (all of them: the split is further
    out, re-raised)."""
    if lanes is None:
        raise d
    stopped = np.ones(ex.n, bool)
    stopped[lanes] = False
    ex.diverged(d.calls, [(stopped, f"left the while loop at {current_site()}")],
                f"in the while loop at {current_site()}")
    raise d  # (diverged raises)
