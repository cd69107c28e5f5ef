"""Pytree helpers over optree, with JAX's conventions.

``None`` is an empty subtree (not a leaf), dicts flatten in sorted-key order, namedtuples and registered
classes are nodes: optree's defaults with ``none_is_leaf=False`` match ``jax.tree_util``. spmdsim's own
classes of nodes live in optree's namespace ``"spmdsim"`` (see :func:`register_pytree_node`).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import optree

__all__ = ["flatten", "flatten_with_paths", "unflatten", "is_leaf", "keystr", "broadcast_prefix", "prefix_leaves",
           "register_pytree_node", "NAMESPACE"]

NAMESPACE = "spmdsim"
_flatten = functools.partial(optree.tree_flatten, namespace=NAMESPACE)
_LEAF = optree.tree_structure(0, namespace=NAMESPACE)


def flatten(tree) -> tuple[list, Any]:
    """``(leaves, treedef)``; a NumPy array, the usual operand of a collective, without a walk."""
    if type(tree) is np.ndarray:
        return [tree], _LEAF
    return _flatten(tree)


def unflatten(treedef, leaves):
    return leaves[0] if treedef is _LEAF else optree.tree_unflatten(treedef, leaves)


def is_leaf(x) -> bool:
    """A pytree leaf (``None`` is an empty subtree, not a leaf)."""
    return optree.tree_is_leaf(x, namespace=NAMESPACE)


def register_pytree_node(cls: type, flatten_func: Callable, unflatten_func: Callable) -> type:
    """Make ``cls`` a pytree node for spmdsim, like ``jax.tree_util.register_pytree_node``:
    ``flatten_func(x) -> (children, aux_data)`` and ``unflatten_func(aux_data, children) -> x``.
    (For the JAX front end, register the class with JAX as usual.)"""
    return optree.register_pytree_node(cls, flatten_func, unflatten_func, namespace=NAMESPACE)


def keystr(path) -> str:
    """``('a', 0)`` -> ``"['a'][0]"``, the way ``jax.tree_util.keystr`` writes a key path."""
    return "".join(f"[{entry!r}]" for entry in path)


def flatten_with_paths(tree) -> tuple[list[str], list[Any], Any]:
    paths, leaves, treedef = optree.tree_flatten_with_path(tree, namespace=NAMESPACE)
    return [keystr(p) for p in paths], leaves, treedef


def prefix_leaves(prefix) -> list:
    """The leaves of an ``in_axes``/``out_axes`` tree, where ``None`` counts as a leaf."""
    return optree.tree_leaves(prefix, none_is_leaf=True, namespace=NAMESPACE)


def is_prefix_leaf(node) -> bool:
    """A leaf of an ``in_axes``-like prefix tree: ``None`` or a pytree leaf."""
    return node is None or optree.tree_is_leaf(node, none_is_leaf=True, namespace=NAMESPACE)


def broadcast_prefix(prefix, full, *, name: str, hint: str = "",
                     is_prefix_leaf: Callable[[Any], bool] = is_prefix_leaf) -> list:
    """Expand ``prefix`` (e.g. ``in_axes``) to one entry per leaf of ``full``, in flattening order.

    A prefix leaf (an int or ``None``) applies to every leaf of the subtree it stands for. Raises
    ValueError naming the key path where ``prefix`` is not a tree prefix of ``full``, as JAX does
    ("pytree structure error: ... at key path pmap in_axes[0][0]").
    """
    if (type(prefix) in (tuple, list) and type(full) is type(prefix) and len(prefix) == len(full)
            and all(p is None or type(p) is int for p in prefix)
            and all(type(f).__module__ == "numpy" and hasattr(f, "shape") for f in full)):
        return list(prefix)  # the common flat case (the JAX front end's flat axes): nothing to walk
    try:  # the result depends only on the prefix and the structure of `full`: walked once per pair
        key = (prefix, is_prefix_leaf, optree.tree_structure(full, namespace=NAMESPACE))
        found = _broadcasts.get(key)
    except TypeError:  # an unhashable prefix (a list, a dict)
        key = found = None
    if found is not None:
        return list(found)
    out = _walk_prefix(prefix, full, name, hint, is_prefix_leaf)
    if key is not None:
        if len(_broadcasts) > 1024:
            _broadcasts.clear()
        _broadcasts[key] = tuple(out)
    return out


_broadcasts: dict = {}


def _walk_prefix(prefix, full, name: str, hint: str, is_prefix_leaf: Callable[[Any], bool]) -> list:
    out: list = []

    def mismatch(path, kind, detail):
        raise ValueError(
            f"pytree structure error: {kind} at key path {name}{keystr(path)}: {detail}. "
            f"The value of {name} must be a tree prefix of the value it describes, but it was not.{hint}")

    def walk(p, f, path):
        if is_prefix_leaf(p):
            out.extend([p] * len(optree.tree_leaves(f, namespace=NAMESPACE)))
            return
        if f is None or optree.tree_is_leaf(f, namespace=NAMESPACE):
            mismatch(path, "different types", f"{name} has a subtree of type {type(p).__name__} where the value "
                                              f"has a leaf ({'None' if f is None else type(f).__name__})")
        if type(p) is not type(f):
            mismatch(path, "different types", f"{name} has a subtree of type {type(p).__name__} but the value "
                                              f"has a subtree of type {type(f).__name__}")
        p_level = optree.tree_flatten_one_level(p, namespace=NAMESPACE)
        f_level = optree.tree_flatten_one_level(f, namespace=NAMESPACE)
        if len(p_level.children) != len(f_level.children):
            mismatch(path, f"different lengths of {type(p).__name__}",
                     f"{name} has {len(p_level.children)} children, the value has {len(f_level.children)}")
        if p_level.metadata != f_level.metadata:
            mismatch(path, "different pytree metadata",
                     f"{p_level.metadata!r} in {name}, {f_level.metadata!r} in the value")
        for entry, pc, fc in zip(f_level.entries, p_level.children, f_level.children):
            walk(pc, fc, (*path, entry))

    walk(prefix, full, ())
    return out
