"""The ``spmdsim`` command: ``demo``, ``run SCRIPT.py``, ``debug SCRIPT.py``, ``conformance``."""
from __future__ import annotations

import sys

COMMANDS = {
    "demo": ("spmdsim.demo", "data-parallel linear regression on the diabetes table, on virtual devices"),
    "run": ("spmdsim.jax._run", "run an unmodified JAX script with jax.pmap on virtual devices (needs jax)"),
    "debug": ("spmdsim.debug", "step through a script's collectives, pdb style (n, c, show, where, quit)"),
    "conformance": ("spmdsim.conformance", "compare spmdsim with the installed jax.pmap; print and write a matrix"),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:12s} {text}" for name, (_, text) in COMMANDS.items()]
        print("usage: spmdsim COMMAND [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    import importlib

    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
