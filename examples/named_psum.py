"""A named psum (seed pattern 000): every device doubles its element, then they sum over the axis 'devices'.

With data = [0, 1, 2, 3] on 4 devices, every device ends with 2 * (0 + 1 + 2 + 3) = 12.
"""
import numpy as np

import spmdsim
from spmdsim import lax


def scaled_sum(x):
    return lax.psum(x * 2.0, axis_name="devices")


def main(n_devices: int = 4):
    data = np.arange(n_devices, dtype=np.float32)
    result = spmdsim.pmap(scaled_sum, axis_name="devices")(data)
    print("input :", data)
    print("result:", result, "(the same on every device)")
    return data, result


if __name__ == "__main__":
    main()
