"""A plain elementwise map (seed pattern 004): x * 2 on every device's block of a (devices, 3) array.

With one device the mapped axis must have size 1: pmap does not "fall back to vmap" over a longer axis.
"""
import numpy as np

import spmdsim


def simple_computation(x):
    return x * 2


def main(n_devices: int = 8):
    input_data = np.arange(n_devices * 3).reshape(n_devices, 3)
    result = spmdsim.pmap(simple_computation)(input_data)
    print("input", input_data.shape, "-> output", result.shape, result.dtype)
    print(result)
    return input_data, result


if __name__ == "__main__":
    main()
