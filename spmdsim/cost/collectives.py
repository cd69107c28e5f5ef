"""How long a collective takes on a :class:`~spmdsim.cost.hardware.Topology`: the scaling book's formulas
(jax-ml/scaling-book, chapters 'sharding' and 'gpus'), for the devices a collective actually spans.

TPU (a torus of ICI links, one-way bandwidth ``W`` per link, ``T_min`` per hop), for an array of ``V`` bytes
gathered (all-gather), or reduced and scattered (reduce-scatter), over a group whose chips span torus axes of
``n_1, n_2, ...`` chips:

- each axis brings ``2 W`` when it wraps around (a bidirectional ring) and ``W * n / (n - 1)`` when it does not
  (a line: the book's ``(n - 1)`` hops of ``V / n`` bytes one way);
- ``T = max(T_min * hops, V / sum(axis bandwidths))``, hops ``n / 2`` per wrapped axis, ``n - 1`` per line
  ('sharding': "AllGather over multiple axes", "A note on ICI latency");
- an all-reduce (psum, pmean, pmax, pmin) is a reduce-scatter then an all-gather: twice that;
- an all-to-all of an array of ``V`` bytes in all is a quarter of the all-gather's bandwidth time on a wrapped
  ring, half on a line ('sharding', Some Problems to Work);
- a ppermute sends each device's block point to point: ``bytes / (W * routes) + hops * T_min`` for the farthest
  pair, routes the number of torus axes the pair differs along ('tpus', worked problem on ICI transfer).

GPU (``node_size`` GPUs behind NVLink switches, each GPU egressing ``W_gpu`` one way; ``W_node`` out of a node):
``T = V * max((g - 1) / (g W_gpu), (k - 1) / (k W_node))`` for a group of ``g`` GPUs per node over ``k`` nodes
('gpus', "Intra-node collectives" and "Cross-node collectives"), an all-to-all ``V (N - 1) / (W N^2)``
within a node, a ppermute ``bytes / W_gpu`` (``W_node / node_size`` between nodes), latencies per step.

Not modelled: contention between collectives or with other traffic, the target's algorithm choice (trees,
SHARP in-network reductions), and overlap of communication with compute (see docs/cost_model.md).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from spmdsim.cost.hardware import Topology

__all__ = ["CommCost", "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "ppermute", "group_shape"]


@dataclasses.dataclass(frozen=True)
class CommCost:
    """A collective's predicted time (s): the larger of its bandwidth and latency terms; ``links``: which
    links it crosses, in words."""

    time: float
    bandwidth_time: float
    latency_time: float
    links: str

    @property
    def bound(self) -> str:
        return "latency" if self.latency_time > self.bandwidth_time else "bandwidth"

    def scaled(self, factor: float) -> "CommCost":
        return CommCost(self.time * factor, self.bandwidth_time * factor, self.latency_time * factor, self.links)


@dataclasses.dataclass(frozen=True)
class GroupShape:
    """Where a group of devices lies on the topology. TPU: ``axes`` = ((torus axis, chips along it, wraps), ...)
    for the axes the group spans (``regular``: the group is the product of its coordinates); GPU: ``per_node``
    GPUs in each of ``nodes`` nodes."""

    size: int
    axes: tuple = ()
    regular: bool = True
    per_node: int = 0
    nodes: int = 0

    def describe(self, topo: Topology) -> str:
        if topo.chip.kind == "gpu":
            if self.nodes <= 1:
                return f"NVLink, {self.per_node} GPUs in a node"
            return f"{self.nodes} nodes x {self.per_node} GPUs (node network)"
        if not self.axes:
            return "no link (one chip)"
        names = "xyz"
        parts = [f"{names[k] if k < 3 else k}:{n}{' wrapped' if wraps else ''}" for k, n, wraps in self.axes]
        return "ICI " + " ".join(parts) + ("" if self.regular else " (irregular group: taken as a line)")


def group_shape(topo: Topology, group: Sequence[int]) -> GroupShape:
    """How the devices ``group`` (device ids, JAX's order) lie on ``topo``."""
    group = list(group)
    if len(group) > topo.count or max(group, default=0) >= topo.count:
        raise ValueError(f"device {max(group)} is not on {topo.label} ({topo.count} chips)")
    if topo.chip.kind == "gpu":
        nodes: dict = {}
        for d in group:
            node, _ = topo.coords(d)
            nodes[node] = nodes.get(node, 0) + 1
        return GroupShape(len(group), per_node=max(nodes.values()), nodes=len(nodes))
    coords = [topo.coords(d) for d in group]
    axes = []
    for k in range(len(topo.shape)):
        n = len({c[k] for c in coords})
        if n > 1:
            axes.append((k, n, bool(topo.wraparound[k]) and n == topo.shape[k]))
    regular = math.prod(n for _, n, _ in axes) == len(group)
    return GroupShape(len(group), tuple(axes), regular)


def _tpu_gather(topo: Topology, shape: GroupShape, nbytes: float) -> CommCost:
    w = float(topo.chip.interconnect["link_bandwidth"])
    lat = float(topo.chip.interconnect.get("hop_latency", 0.0))
    if shape.size <= 1:
        return CommCost(0.0, 0.0, 0.0, shape.describe(topo))
    if shape.regular:
        bandwidth = sum(2 * w if wraps else w * n / (n - 1) for _, n, wraps in shape.axes)
        hops = sum(n // 2 if wraps else n - 1 for _, n, wraps in shape.axes)
    else:  # an irregular group: a line through its chips
        n = shape.size
        bandwidth, hops = w * n / (n - 1), n - 1
    bw_time, lat_time = nbytes / bandwidth, hops * lat
    return CommCost(max(bw_time, lat_time), bw_time, lat_time, shape.describe(topo))


def _gpu_gather(topo: Topology, shape: GroupShape, nbytes: float) -> CommCost:
    ic = topo.chip.interconnect
    g, k = shape.per_node, shape.nodes
    if shape.size <= 1:
        return CommCost(0.0, 0.0, 0.0, shape.describe(topo))
    terms = [0.0]
    if g > 1:
        terms.append((g - 1) / (g * float(ic["gpu_bandwidth"])))
    if k > 1:
        terms.append((k - 1) / (k * float(ic["node_bandwidth"])))
    bw_time = nbytes * max(terms)
    lat_time = (g - 1) * float(ic.get("hop_latency", 0.0)) + (k - 1) * float(ic.get("node_latency", 0.0))
    return CommCost(max(bw_time, lat_time), bw_time, lat_time, shape.describe(topo))


def all_gather(topo: Topology, group: Sequence[int], nbytes: float) -> CommCost:
    """An all-gather whose gathered array is ``nbytes`` bytes (each device contributes ``nbytes / len(group)``)."""
    shape = group_shape(topo, group)
    return (_gpu_gather if topo.chip.kind == "gpu" else _tpu_gather)(topo, shape, nbytes)


def reduce_scatter(topo: Topology, group: Sequence[int], nbytes: float) -> CommCost:
    """A reduce-scatter of an ``nbytes`` array (each device's unreduced operand): as an all-gather's time."""
    return all_gather(topo, group, nbytes)


def all_reduce(topo: Topology, group: Sequence[int], nbytes: float) -> CommCost:
    """An all-reduce of an ``nbytes`` array: a reduce-scatter and an all-gather ('sharding': 2 * V / W)."""
    return all_gather(topo, group, nbytes).scaled(2.0)


def all_to_all(topo: Topology, group: Sequence[int], nbytes: float) -> CommCost:
    """An all-to-all of an array of ``nbytes`` in all (each device holds ``nbytes / len(group)``)."""
    shape = group_shape(topo, group)
    n = shape.size
    if n <= 1:
        return CommCost(0.0, 0.0, 0.0, shape.describe(topo))
    if topo.chip.kind == "gpu":
        ic = topo.chip.interconnect
        if shape.nodes <= 1:
            bw_time = nbytes * (n - 1) / (float(ic["gpu_bandwidth"]) * n * n)
        else:  # each node sends (k - 1)/k of its GPUs' blocks out through its egress
            k = shape.nodes
            bw_time = max(nbytes * (shape.per_node - 1) / (float(ic["gpu_bandwidth"]) * n * n),
                          shape.per_node * nbytes / n * (k - 1) / k / float(ic["node_bandwidth"]))
        lat = float(ic.get("hop_latency", 0.0)) if shape.nodes <= 1 else float(ic.get("node_latency", 0.0))
        return CommCost(max(bw_time, lat), bw_time, lat, shape.describe(topo))
    gather = _tpu_gather(topo, shape, nbytes)
    wrapped = shape.regular and all(wraps for _, _, wraps in shape.axes)
    bw_time = gather.bandwidth_time / (4.0 if wrapped else 2.0)
    return CommCost(max(bw_time, gather.latency_time), bw_time, gather.latency_time, gather.links)


def ppermute(topo: Topology, pairs: Sequence[tuple[int, int]], nbytes: float) -> CommCost:
    """Each ``(source, destination)`` device pair sends ``nbytes``: the slowest pair's time (links shared by
    several pairs are not modelled as contended)."""
    worst = CommCost(0.0, 0.0, 0.0, "no transfer")
    ic = topo.chip.interconnect
    for src, dst in pairs:
        if src == dst:
            continue
        if topo.chip.kind == "gpu":
            (n1, _), (n2, _) = topo.coords(src), topo.coords(dst)
            if n1 == n2:
                bw, lat, links = float(ic["gpu_bandwidth"]), float(ic.get("hop_latency", 0.0)), "NVLink"
            else:
                bw = float(ic["node_bandwidth"]) / topo.node_size
                lat, links = float(ic.get("node_latency", 0.0)), "node network"
            cost = CommCost(nbytes / bw + lat, nbytes / bw, lat, links)
        else:
            a, b = topo.coords(src), topo.coords(dst)
            hops, routes = 0, 0
            for k, n in enumerate(topo.shape):
                d = abs(a[k] - b[k])
                if topo.wraparound[k]:
                    d = min(d, n - d)
                hops += d
                routes += d > 0
            w = float(ic["link_bandwidth"])
            bw_time, lat_time = nbytes / (w * routes), hops * float(ic.get("hop_latency", 0.0))
            cost = CommCost(bw_time + lat_time, bw_time, lat_time, f"ICI, {hops} hop{'s' * (hops != 1)} over "
                                                                   f"{routes} route{'s' * (routes != 1)}")
        if cost.time > worst.time:
            worst = cost
    return worst
