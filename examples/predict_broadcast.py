"""Prediction with broadcast parameters (seed pattern 002): the parameters go to every device unchanged
(in_axes=None), the batch is sharded (in_axes=0): (devices, batch_per_device, features)."""
import numpy as np

import spmdsim


def predict(params, inputs):
    return inputs @ params["w"] + params["b"]


def main(n_devices: int = 8, batch_per_device: int = 32, input_dim: int = 10, output_dim: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((input_dim, output_dim)), "b": rng.standard_normal(output_dim)}
    batch = rng.standard_normal((n_devices * batch_per_device, input_dim))
    sharded = batch.reshape(n_devices, batch_per_device, input_dim)
    predictions = spmdsim.pmap(predict, in_axes=(None, 0))(params, sharded)
    print("sharded inputs", sharded.shape, "-> predictions", predictions.shape)
    return params, batch, predictions


if __name__ == "__main__":
    main()
