"""The name a collective equation is shown under: the public ``jax.lax`` function the user called."""
from __future__ import annotations

import functools
import os

import jax

__all__ = ["user_name"]

# shard_map's varying-manual-axes primitives are the plain collectives the user called (check_vma=True binds them).
_CALLED_AS = {"psum_invariant": "psum", "all_gather_invariant": "all_gather"}


def user_name(eqn) -> str:
    """The public function of ``jax.lax`` whose call produced collective equation ``eqn``, as the user wrote it:
    ``pmean`` for the psum that ``jax.lax.pmean`` binds (a ``div`` follows it), ``psum`` for the
    ``psum_invariant`` that ``jax.lax.psum`` binds inside a ``jax.shard_map``. Read from the equation's source
    traceback (the outermost public function of ``jax/_src/lax/parallel.py`` before the first frame outside
    JAX); without one (an equation JAX made, e.g. a transpose), the primitive's own name."""
    name = eqn.primitive.name
    try:
        called = _called(eqn.source_info.traceback)
    except Exception:  # noqa: BLE001 - source info is a nicety, never an error
        called = None
    return called or _CALLED_AS.get(name, name)


@functools.lru_cache(maxsize=8192)
def _called(traceback) -> str | None:
    if traceback is None:
        return None
    called = None
    for frame in traceback.frames:  # innermost first
        if not frame.file_name.startswith(_JAX_DIR):
            break
        if frame.file_name.endswith(_PARALLEL) and hasattr(jax.lax, frame.function_name):
            called = frame.function_name
    return called


_JAX_DIR = os.path.dirname(jax.__file__) + os.sep
_PARALLEL = os.path.join("_src", "lax", "parallel.py")
