"""The hosts' side of one global call on the vectorized executor (see :class:`VectorCall`): the communicator
that a :class:`~spmdsim.primitives._batch.Batch` of a host's devices hands its collectives to.
"""
from __future__ import annotations

import math

import numpy as np

from spmdsim.runtime import _hosts

from spmdsim.primitives import _batch, _primitives, _reduction
from spmdsim.runtime._reports import Signature, describe, mismatch_text
from spmdsim.errors import CollectiveDeadlockError, CollectiveMismatchError, HostLostError
from spmdsim.hosts.messages import portable

__all__ = ["VectorCall"]


class _PeerFailed(Exception):
    """This host stopped its vectorized call because another host failed (its error is the call's outcome)."""


class VectorCall:
    """The hosts' side of one global call on the vectorized executor: each host computes its own devices, all at
    once, in its host thread; a collective whose communicators lie within each host is computed there, one that
    spans hosts is a numbered step of the call:

    1. every host sends every other host its call (signature, line) and, unless the step is a chain, its devices'
       operands; different calls are a CollectiveMismatchError on every host, the same on each;
    2. a **chain**, for a reduction that every host holds a run of consecutive ranks of, in every group
       (``psum`` over a pmap axis, or over the host-major mesh axis): the partial fold travels host to host in
       rank order (each host folds its ranks into it, exactly the one-process fold) and the last host sends the
       result to all: every host holds its own blocks and one partial, never every host's;
    3. otherwise every host computes the collective on every host's operands, in global device order (the
       one-process computation) and keeps its devices' results.

    A host whose devices finished without reaching a step the others wait in is a CollectiveDeadlockError; at the
    end every host sends every other its outcome, and every host raises the first host's error."""

    def __init__(self, host, k: int):
        self.host, self.k = host, k
        self.step = 0

    def lose(self, error: HostLostError) -> None:
        pass  # every wait here is in the host thread, which sees the loss itself

    # -- messages ------------------------------------------------------------------------------------------

    def _send(self, dest: int, tag, *payload) -> None:
        self.host.send(dest, ("vx", self.k, tag, self.host.index, *payload))

    def _wait(self, tag, source: int, what: str = ""):
        """The payload of message ``tag`` from host ``source``; raises when ``source`` ended the call before
        sending it (a deadlock, or _PeerFailed when it failed)."""
        host, inbox = self.host, None

        def ready():
            found = host.vector.get(self.k, {})
            if (tag, source) in found:
                return (found.pop((tag, source)),)
            if tag != "end" and ("end", source) in found:
                return ("ended",)
            return None

        with host.cond:
            inbox = host.wait_for(ready)
        if inbox[0] != "ended":
            return inbox[0]
        steps, error, peer_failed = host.vector[self.k][("end", source)][:3]
        if error is not None or peer_failed:  # it ended because a device failed somewhere: not a deadlock
            raise _PeerFailed
        raise self._deadlock(source, what, steps)

    def _deadlock(self, source: int, what: str, steps: int) -> CollectiveDeadlockError:
        return CollectiveDeadlockError(
            f"{what} can never complete: host {source}'s devices returned without reaching it (after {steps} "
            f"collective{'' if steps == 1 else 's'} across hosts). On real hardware this program hangs.\n\n"
            f"Fix: make every device call the same collectives in the same order.", [f"host {source}: returned"])

    def end(self, error: BaseException | None, result):
        """The outcome of the call on every host: the error of the first host that failed, else ``result``."""
        mine = None if isinstance(error, _PeerFailed) else error
        for h in range(self.host.count):
            if h != self.host.index:
                self._send(h, "end", self.step, portable(mine), isinstance(error, _PeerFailed))
        errors = {}
        for h in range(self.host.count):
            if h == self.host.index:
                errors[h] = mine
                continue
            with self.host.cond:
                found = self.host.wait_for(lambda: self.host.vector.get(self.k, {}).get(("end", h)))
            errors[h] = found[1]
        with self.host.cond:
            self.host.vector.pop(self.k, None)
        first = next((h for h in sorted(errors) if errors[h] is not None), None)
        if first is None:
            if error is not None:  # _PeerFailed, yet nobody failed: cannot happen
                raise AssertionError("spmdsim bug: a host stopped for a failure nobody reported") from error
            return result
        if first == self.host.index:
            raise mine
        raise errors[first]

    # -- collectives ---------------------------------------------------------------------------------------

    def collective(self, batch, prim, named: tuple, positions: list, groups, rule_params: dict, operands: list,
                   params: dict, api: str, site, epilogue) -> list:
        """``Batch.collective`` for a batch of this host's devices (see the class docstring)."""
        count = self.host.count
        per_host = batch.count // count
        box = _hosts.host_box(batch.axes, per_host)
        first = self.host.index * per_host
        present = batch.present()
        if all(box[p][1] == batch.sizes[p] for p in positions):  # every communicator lies within a host
            ids = None if len(present) == per_host else present - first
            return _batch.Batch(box, ids).collective(prim, named, operands, params, api, site, epilogue)
        if len(present) != per_host:
            raise NotImplementedError(
                f"{api} over {named!r} inside a cond or while branch that only some of a host's devices take, in a "
                f"multi-host run: the vectorized executor cannot exchange the blocks of part of a host's devices "
                f"with other hosts. Use executor='threads', or move the collective out of the branch.")
        avals = tuple((x.shape[1:], x.dtype) for x in operands)
        signature = Signature(prim.name, tuple(named), tuple(batch.sizes[p] for p in positions),
                              (("axis_index_groups", groups), *sorted(rule_params.items())), avals)
        site = (site() if callable(site) else site) or "<unknown>"
        step, self.step = self.step, self.step + 1
        order = self._chain_order(batch, prim, positions, groups, per_host)
        payload = None if order is not None else list(operands)
        others = [h for h in range(count) if h != self.host.index]
        for h in others:
            self._send(h, step, signature, site, api, payload)
        what = f"{describe(signature, api)} (collective {step} across hosts)"
        calls = {self.host.index: (signature, site, api, payload)}
        for h in others:
            calls[h] = self._wait(step, h, what)
        if any(c[0] != signature for c in calls.values()):
            raise self._mismatch(calls, step)
        if order is None:
            full = [np.concatenate([calls[h][3][i] for h in range(count)]) for i in range(len(operands))]
            out = _batch.Batch(batch.axes).collective(prim, named, full, params, api, site, epilogue)
            return [o[first:first + per_host] for o in out]
        return self._chain(step, order, box, positions, prim, operands, epilogue, signature.sizes)

    def _mismatch(self, calls: dict, step: int) -> CollectiveMismatchError:
        lines = [f"host {h}'s devices: {describe(sig, api)} at {site}" for h, (sig, site, api, _) in
                 sorted(calls.items())]
        return CollectiveMismatchError(mismatch_text(f"at collective {step} across hosts", lines,
                                                     "(vectorized executor: every device of a host makes the "
                                                     "same call)"), lines)

    def _chain_order(self, batch, prim, positions: list, groups, per_host: int) -> list | None:
        """The hosts in rank order when the reduction can be a chain (see the class docstring), else None."""
        if prim.name not in ("psum", "pmax", "pmin") or groups is not None:
            return None
        if prim.name == "psum" and _reduction.current_reduction_order().order != "sequential":
            return None
        others = [p for p in range(len(batch.axes)) if p not in positions]
        box = _hosts.host_box(batch.axes, per_host)
        if any(box[p][1] != batch.sizes[p] for p in others):
            return None  # some groups lie on other hosts only
        ranges = []
        for h in range(self.host.count):
            ranks = _batch.Batch(batch.axes, np.arange(h * per_host, (h + 1) * per_host)).axis_index(
                tuple(batch.names[p] for p in positions), "psum")
            low = int(ranks.min())
            within = np.sort(np.unique(ranks))
            if len(within) * (batch.count // math.prod(batch.sizes[p] for p in positions)) != per_host \
                    or not np.array_equal(within, np.arange(low, low + len(within))):
                return None
            ranges.append((low, h))
        return [h for _, h in sorted(ranges)]

    def _chain(self, step: int, order: list, box, positions: list, prim, operands: list, epilogue,
               sizes: tuple) -> list:
        local = _batch.Batch(box)
        ufunc = _primitives.REDUCERS[prim.name]
        grouped = [local._to_groups(x, positions) for x in operands]  # (G, ranks here, *block), in rank order
        me = order.index(self.host.index)
        partial = None if me == 0 else self._wait((step, "chain"), order[me - 1],
                                                  f"{prim.name} (collective {step} across hosts)")[0]
        folded = [_fold_on(ufunc, None if partial is None else partial[i], x) for i, x in enumerate(grouped)]
        if me + 1 < len(order):
            self._send(order[me + 1], (step, "chain"), folded)
            final = self._wait((step, "final"), order[-1], f"{prim.name} (collective {step} across hosts)")[0]
        else:
            final = [_frozen(f.astype(x.dtype, copy=False)) for f, x in zip(folded, grouped, strict=True)]
            for h in order[:-1]:
                self._send(h, (step, "final"), final)
        n = math.prod(sizes)
        out = []
        for f, x in zip(final, grouped, strict=True):
            y = _primitives._replicated(x, f)
            out.append(local._from_groups(y if epilogue is None else epilogue(y, n), positions))
        return out


def _fold_on(ufunc, partial, x: np.ndarray) -> np.ndarray:
    """``partial`` (None: nothing yet) folded with ``x[:, 0], x[:, 1], ...`` left to right, in the accumulation
    dtype of the current reduction order: the one-process sequential fold, continued on this host."""
    acc = None
    if ufunc is np.add:
        order = _reduction.current_reduction_order()
        acc = order.accumulation_dtype or (np.dtype(np.float32) if x.dtype == _reduction._BFLOAT16 else None)
    blocks = [x[:, r] if acc is None else x[:, r].astype(acc) for r in range(x.shape[1])]
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.array(blocks[0]) if partial is None else ufunc(partial, blocks[0])
        for b in blocks[1:]:
            ufunc(out, b, out=out)
    return out


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a
