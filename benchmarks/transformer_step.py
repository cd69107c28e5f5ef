"""The benchmarks' transformer training step (benchmarks/programs.py, issue 27) as a plain JAX script with
``jax.pmap``, for ``spmdsim run``: ``spmdsim run --hardware tpu-v5e:2x4 benchmarks/transformer_step.py [STEPS]``
prints what each step would cost on 8 TPU v5e chips (spmdsim.cost). Run from the repository root."""
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import programs  # noqa: E402

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
n = jax.device_count()
step, in_axes, out_axes, args = programs.work_program("transformer", n)
params, opt_state, x, y = args
pstep = jax.pmap(step, "i", in_axes=in_axes, out_axes=out_axes)
for k in range(steps):
    params, opt_state, loss = pstep(params, opt_state, x, y)
print(f"{steps} steps of the transformer block on {n} devices; last loss {float(loss):.4f}")
