"""SciPy for the rules, imported when a rule first reads it: ``scipy.special`` and ``scipy.linalg`` (and NumPy's
f2py, which it imports) cost about 0.25 s of every process's start-up, and most programs never reach a special
function or LAPACK (``spmdsim run`` of a small script: about 1.3 s of CPU, a fifth of it SciPy's import before)."""
from __future__ import annotations

import importlib

__all__ = ["special", "blas", "lapack", "special_function"]


class _Module:
    """A module, imported at the first read of one of its attributes (Python's import lock makes first reads from
    several device threads at once safe); each attribute read is kept."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # (copy, pickle and introspection probe dunders: not the module's)
            raise AttributeError(attr)
        value = getattr(importlib.import_module(self._name), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<{self._name}, imported at first use>"


special = _Module("scipy.special")
blas = _Module("scipy.linalg.blas")
lapack = _Module("scipy.linalg.lapack")


def special_function(name: str):
    """``scipy.special``'s function ``name`` for a table built at import: a function of that name that imports
    SciPy at its first call."""
    def fn(*args):
        return getattr(special, name)(*args)
    fn.__name__ = name
    return fn
