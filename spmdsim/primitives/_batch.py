"""The vectorized executor's devices: a :class:`Batch` holds every device's block of a value stacked on a leading
axis, and computes a collective for all of them at once with the primitive's ``vectorized`` form (see
:mod:`spmdsim.primitives._primitives`, the specification, and its :func:`~spmdsim.primitives._primitives.bind`,
which hands a collective to the current batch); :class:`Diverged`, what a collective reached by only some of a
batch's devices raises; :class:`vectorized_batch` sets the current batch of a thread.
"""
from __future__ import annotations

import math
from typing import Callable, Hashable, Sequence

import numpy as np

from spmdsim.runtime import _runtime
from spmdsim.runtime._axes import Frame, frames_label, resolve_axes
from spmdsim.runtime._reports import TABLE_HEADER, Signature, deadlock_text, describe, format_table, mismatch_text, who
from spmdsim.errors import CollectiveDeadlockError, CollectiveMismatchError
from spmdsim.primitives._primitives import Collective, _local, check_groups


class Diverged(Exception):
    """Raised by a collective that devices of a :class:`Batch` subset reach while other members of their
    communicators are elsewhere (another ``cond`` branch, out of a ``while`` loop). ``calls`` holds, per group of
    devices waiting in a collective, ``(device ids, Signature, site, api)``. The ``cond``/``while`` rule that
    split the devices catches it and reports (:meth:`Batch.diverged`): the vectorized executor cannot suspend a
    branch, so this is where it finds out what the thread executor's rendezvous would."""

    def __init__(self, calls: list):
        super().__init__(calls)
        self.calls = calls


# (primitive, axis names, mesh, operand avals, parameters) of a vectorized collective seen before -> the axes'
# positions, the group size, the groups and the rule's parameters, as checked then.
_checked: dict = {}


class Batch:
    """The devices the vectorized executor computes at once: the mesh ``axes`` ((name, size) pairs, row-major),
    and ``ids``, the indices (into the row-major device order) of the devices present, ``None`` for all.
    Every operand carries them on a leading axis.

    ``comm``: None when this process computes every collective; in a run of several processes, the communicator
    of the call (handed out by :meth:`~spmdsim.runtime._process_group.ProcessGroup.run_vectorized`; ``ids`` are then this
    process's devices), to which :meth:`collective` hands each collective, as mpi4py code hands it to a ``Comm``.
    """

    def __init__(self, axes: Sequence[tuple[Hashable, int]], ids: np.ndarray | None = None, comm=None):
        self.axes = tuple(axes)
        self.names = tuple(name for name, _ in self.axes)
        self.sizes = tuple(size for _, size in self.axes)
        self.count = math.prod(self.sizes)
        self.ids = ids
        self.comm = comm
        self.mailboxes: dict = {}  # psend -> precv transfers, per axis names

    def subset(self, mask: np.ndarray) -> "Batch":
        return Batch(self.axes, self.present()[mask], self.comm)

    def present(self) -> np.ndarray:
        """The row-major indices of the devices present."""
        return np.arange(self.count) if self.ids is None else self.ids

    def label(self, device: int) -> str:
        """``device 5 [i=1, j=1]`` for row-major device index ``device``, as the thread executor names it."""
        coords = np.unravel_index(device, self.sizes) if self.axes else ()
        return frames_label([Frame(name, size, int(c), (), True)
                             for (name, size), c in zip(self.axes, coords, strict=True)])

    def position(self, name, api: str) -> int:
        for k in range(len(self.names) - 1, -1, -1):
            if self.names[k] == name:
                return k
        resolve_axes([Frame(n, s, 0, (), True) for n, s in self.axes], (name,), api)  # raises NameError
        raise AssertionError("unreachable")

    def coordinates(self) -> np.ndarray:
        """The mesh coordinates of the devices present: shape ``(devices, len(axes))``."""
        ids = self.present()
        return np.stack(np.unravel_index(ids, self.sizes), axis=-1) if self.axes else np.zeros((len(ids), 0), int)

    def axis_index(self, names: tuple, api: str) -> np.ndarray:
        positions = [self.position(n, api) for n in names]
        coords = self.coordinates()
        index = np.zeros(len(coords), np.int64)
        for p in positions:
            index = index * self.sizes[p] + coords[:, p]
        return index.astype(np.int32)

    def per_device(self, fn: Callable[[int], object]) -> list:
        """``[fn(k) for k in range(devices present)]``, as the thread executor would run them: every device runs,
        and when some raise, the first in device order is raised, naming its device, with every device's error
        in ``device_errors`` (see :func:`spmdsim.runtime._runtime.device_error`). For rules that run user code per
        device (``jax.debug.callback``) and rules without a vectorized form."""
        results, raised = [], []
        for k, device in enumerate(self.present()):
            try:
                results.append(fn(k))
            except Exception as e:  # noqa: BLE001 - reported below, as the thread executor reports it
                raised.append((self.label(int(device)), e))
                results.append(None)
        if raised:
            raise _runtime.device_error(raised)
        return results

    def collective(self, prim: Collective, named: tuple, operands: list, params: dict, api: str,
                   site: str | Callable | None, epilogue) -> list:
        avals = tuple([(x.shape[1:], x.dtype) for x in operands])
        try:
            key = (prim.name, named, self.axes, avals, tuple(params.items()))
            checked = _checked.get(key)
        except TypeError:  # an unhashable parameter value (a list of groups)
            key = checked = None
        if checked is None:
            if len(set(named)) != len(named):
                raise ValueError(f"{api}: repeated axis in `source` argument: {named!r}. Name each axis once.")
            positions = [self.position(n, api) for n in named]
            n = math.prod(self.sizes[p] for p in positions)
            groups = check_groups(params.get("axis_index_groups"), n, prim)
            checked = (positions, n, groups, prim.check(avals, n if groups is None else len(groups[0]), groups,
                                                        **params))
            if key is not None:
                if len(_checked) > 4096:
                    _checked.clear()
                _checked[key] = checked
        positions, n, groups, rule_params = checked
        if self.comm is not None:
            return self.comm.collective(self, prim, named, positions, groups, rule_params, operands, params, api,
                                        site, epilogue)
        if self.ids is not None:
            if not self._whole_communicators(positions, n):
                signature = Signature(prim.name, tuple(named), tuple(self.sizes[p] for p in positions),
                                      (("axis_index_groups", groups), *sorted(rule_params.items())), avals)
                raise Diverged([(self.ids, signature, (site() if callable(site) else site) or "<unknown>", api)])
            # Every communicator here is complete (e.g. a cond split along another axis): compute on the full
            # device axis, the absent devices' blocks zero, and keep the present devices' results.
            full = [np.zeros((self.count, *x.shape[1:]), x.dtype) for x in operands]
            for f, x in zip(full, operands, strict=True):
                f[self.ids] = x
            return [y[self.ids] for y in Batch(self.axes).collective(prim, named, full, params, api, site, epilogue)]
        if prim.joint:  # the operands form one block per device
            grouped = [self._to_groups(x, positions) for x in operands]
            if groups is None:
                return [self._from_groups(prim.vectorized(*grouped, **rule_params), positions)]
            out = np.array(grouped[1])
            for group in groups:
                out[:, list(group)] = prim.vectorized(*(x[:, list(group)] for x in grouped), **rule_params)
            return [self._from_groups(out, positions)]
        return [self._from_groups(_vectorized_grouped(prim, self._to_groups(x, positions), groups, rule_params,
                                                      epilogue), positions) for x in operands]

    def _whole_communicators(self, positions: list[int], n: int) -> bool:
        """Whether the devices present make up whole communicators of the axes at ``positions`` (every member
        of each communicator that one of them belongs to is present)."""
        coords = self.coordinates()
        others = [p for p in range(len(self.axes)) if p not in positions]
        key = np.ravel_multi_index(tuple(coords[:, p] for p in others), [self.sizes[p] for p in others]) \
            if others else np.zeros(len(coords), np.int64)
        counts = np.bincount(key)
        return bool(np.all(counts[key] == n))

    def _layout(self, positions: list[int]) -> list[int]:
        return [p for p in range(len(self.axes)) if p not in positions] + positions

    def _to_groups(self, x: np.ndarray, positions: list[int]) -> np.ndarray:
        """``(devices, *block)`` -> ``(G, n, *block)``: the named axes (in the order named) last, row-major."""
        k = len(self.axes)
        if k == 1:  # one axis (pmap): one group of every device
            return x.reshape(1, *x.shape)
        grid = x.reshape(*self.sizes, *x.shape[1:])
        order = self._layout(positions)
        grid = np.transpose(grid, (*order, *range(k, grid.ndim)))
        n = math.prod(self.sizes[p] for p in positions)
        return grid.reshape(self.count // n, n, *x.shape[1:])

    def _from_groups(self, y: np.ndarray, positions: list[int]) -> np.ndarray:
        k = len(self.axes)
        if k == 1:
            return y.reshape(self.count, *y.shape[2:])
        order = self._layout(positions)
        grid = y.reshape(*(self.sizes[p] for p in order), *y.shape[2:])
        inverse = np.argsort(order)
        grid = np.transpose(grid, (*inverse, *range(k, grid.ndim)))
        return grid.reshape(self.count, *y.shape[2:])

    def diverged(self, calls: list, went_on: list[tuple[np.ndarray, str]], where: str) -> None:
        """Report devices that split at a ``cond`` or ``while`` (``where``) and reached collectives apart.
        ``calls``: the groups waiting in a collective (see :class:`Diverged`); ``went_on``: ``(device ids, what
        they did)`` for the groups that reached none. Raises CollectiveMismatchError when the waiting groups
        called different collectives, CollectiveDeadlockError when some devices went on without them; when every
        group called the same collective, :class:`Diverged` for an enclosing split, or NotImplementedError at
        the top."""
        signatures = {signature for _, signature, _, _ in calls}
        rows, lines = {}, {}
        for ids, signature, site, api in calls:
            collective = f"{api or signature.op}({', '.join(f'{d}{list(s)}' for s, d in signature.avals)})"
            for d in ids:
                label = self.label(int(d))
                rows[int(d)] = (label, "waiting", collective, ", ".join(map(repr, signature.names)), "", site)
                lines[int(d)] = f"{label}: waiting in {describe(signature, api)} at {site}"
        for ids, state in went_on:
            for d in ids:
                rows[int(d)] = (self.label(int(d)), state, "", "", "", "")
                lines[int(d)] = f"{self.label(int(d))}: {state}"
        elsewhere = "in another branch of an enclosing cond or while"
        table = format_table([TABLE_HEADER, *(rows.get(d, (self.label(d), elsewhere, "", "", "", ""))
                                              for d in range(self.count))])
        states = [lines.get(d, f"{self.label(d)}: {elsewhere}") for d in range(self.count)]
        if len(signatures) > 1:
            groups = [f"{who([self.label(int(d)) for d in ids])}: {describe(signature, api)} at {site}"
                      for ids, signature, site, api in calls]
            raise CollectiveMismatchError(mismatch_text(where, groups, table), states)
        ids, signature, site, api = calls[0]
        if went_on:
            reason = "; ".join(f"{who([self.label(int(d)) for d in others])} {state}" for others, state in went_on)
            raise CollectiveDeadlockError(deadlock_text(describe(signature, api), reason, table), states)
        if self.ids is not None:
            raise Diverged(calls)
        sites = sorted({site for _, _, site, _ in calls})
        raise NotImplementedError(
            f"the devices took different paths {where}, and then all called {describe(signature, api)} (at "
            f"{', '.join(sites)}). The thread executor runs this program (the devices meet in one collective "
            f"from different lines); the vectorized executor cannot suspend one branch while another runs. Use "
            f"executor='threads', or move the collective out of the branches.")

def _vectorized_grouped(prim: Collective, x: np.ndarray, groups, params: dict, epilogue) -> np.ndarray:
    if groups is None:
        out = prim.vectorized(x, **params)
        return out if epilogue is None else epilogue(out, x.shape[1])
    out = None
    for group in groups:
        part = prim.vectorized(x[:, list(group)], **params)
        if epilogue is not None:
            part = epilogue(part, len(group))
        if out is None:
            out = np.empty((x.shape[0], x.shape[1], *part.shape[2:]), part.dtype)
        out[:, list(group)] = part
    return out


def current_batch() -> Batch | None:
    """The vectorized executor's devices in this thread (see :class:`vectorized_batch`), or None."""
    return _local.batch


class vectorized_batch:
    """``with vectorized_batch(batch):``: collectives bound in this thread act on ``batch``'s stacked devices."""

    def __init__(self, batch: Batch):
        self.batch = batch

    def __enter__(self) -> Batch:
        self.previous = _local.batch
        _local.batch = self.batch
        return self.batch

    def __exit__(self, *exc) -> None:
        _local.batch = self.previous
