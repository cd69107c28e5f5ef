"""in_axes / out_axes with a replicated scalar (seed pattern 001).

``scale(x, k)`` on 2 devices: x is mapped over axis 0, the scalar k is replicated (in_axes=None), the
results are stacked along axis 0. pmap gives one block per device and never chunks: the data must have
shape (2, rows_per_device, 3), not (4, 3) (the seed page claims a (4, 3) array is split into two (2, 3)
chunks; both JAX and spmdsim reject that call).
"""
import numpy as np

import spmdsim


def scale(x, k):
    return x * k


def main(n_devices: int = 2):
    data = np.arange(12, dtype=np.float32).reshape(n_devices, -1, 3)  # (devices, rows per device, features)
    scalar = np.float32(10.0)
    result = spmdsim.pmap(scale, in_axes=(0, None), out_axes=0)(data, scalar)
    print("per-device blocks:", data.shape[1:], "-> result", result.shape)
    print(result.reshape(-1, 3))
    # out_axes=1 puts the device axis second instead: (rows per device, devices, features).
    swapped = spmdsim.pmap(scale, in_axes=(0, None), out_axes=1)(data, scalar)
    return data, result, swapped


if __name__ == "__main__":
    main()
