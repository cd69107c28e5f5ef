"""Shared by the JAX examples: `--out FILE.npz` saves what main() returned, so runs can be compared."""
import sys

import numpy as np


def finish(results: dict) -> dict:
    for name, value in results.items():
        print(f"{name}: {np.asarray(value).shape} {np.asarray(value).dtype}")
    if "--out" in sys.argv:
        np.savez(sys.argv[sys.argv.index("--out") + 1], **{k: np.asarray(v) for k, v in results.items()})
    return results
