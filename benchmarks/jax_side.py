"""The jax.pmap side of one benchmark, in its own process (XLA's CPU device count is fixed at start-up):
``python -m benchmarks.jax_side BENCH N REPEATS WARMUP`` prints one JSON line."""
import json
import os
import sys


def main():
    bench, n, repeats, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", n)
    import numpy as np

    from benchmarks import programs
    from benchmarks.timing import measure

    if bench == "latency":
        f = jax.pmap(programs.jax_chain(jax.lax), "i")
        args = (np.ones((n, 4), np.float32),)
    elif bench == "large":
        f = jax.pmap(lambda x: jax.lax.psum(x, "i"), "i", out_axes=None)
        args = (np.ones((n, programs.BIG), np.float32),)
    elif bench in ("grad", "jit"):
        make = programs.grad_of_pmap if bench == "grad" else programs.jit_of_pmap
        f = make(jax, jax.pmap)
        x, y = programs.train_data(n)
        args = ({"w": np.zeros(x.shape[-1], np.float32), "b": np.zeros((), np.float32)}, x, y)
    elif bench == "shard_map":
        from jax.sharding import PartitionSpec as P
        mesh = jax.make_mesh(programs.MESH_SHAPE, ("data", "model"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[:n])
        f = jax.jit(jax.shard_map(programs.shard_map_step(jax.lax, jax.numpy), mesh=mesh,
                                  in_specs=(P(None, "model"), P("data"), P("data", "model")),
                                  out_specs=(P(None, "model"), P())))
        args = programs.shard_map_data()
    elif bench == "mesh64":
        from jax.sharding import PartitionSpec as P
        mesh = jax.make_mesh((64, 64), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        f = jax.jit(jax.shard_map(programs.mesh64_program(jax.lax), mesh=mesh, in_specs=P(("x", "y")),
                                  out_specs=P("y"), check_vma=False))
        args = (np.ones((4096 * 4,), np.float32),)
    elif bench in programs.WORK:
        step, in_axes, out_axes, args = programs.work_program(bench, n)
        f = jax.pmap(step, "i", in_axes=in_axes, out_axes=out_axes)
        # The mapped arguments put on the devices once (as a training loop keeps them there): a step then copies
        # no more than spmdsim's, whose devices take views of them.
        split = jax.pmap(lambda a: a)
        args = tuple(split(a) if ax == 0 else a for a, ax in
                     zip(args, in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)))
    elif bench == "cnn":
        step, params, stats, opt_state = programs.jax_cnn_step()
        f = jax.pmap(step, "i", in_axes=(None, None, None, 0, 0), out_axes=None)
        args = (params, stats, opt_state, *programs.cnn_data(n))
    elif bench in ("train", "scale"):
        if bench == "train":
            f = jax.pmap(programs.jax_train_step(jax), "i", in_axes=(None, 0, 0), out_axes=None)
            x, y = programs.train_data(n)
            args = ({"w": np.zeros(x.shape[-1], np.float32), "b": np.zeros((), np.float32)}, x, y)
        else:
            f = jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")
            args = (np.ones((n, 4), np.float32),)
    elif bench == "call":
        f = jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")
        args = (np.ones((n, 4), np.float32),)
    elif bench == "steps":
        step = jax.pmap(programs.jax_train_step(jax), "i", in_axes=(None, 0, 0), out_axes=None)
        x, y = programs.train_data(n)
        params = {"w": np.zeros(x.shape[-1], np.float32), "b": np.zeros((), np.float32)}
        # Blocked every step: with 1000 steps dispatched asynchronously XLA:CPU's all-reduce rendezvous hangs.
        f, args = (lambda *a: programs.training_loop(step, *a, block=jax.block_until_ready)), (params, x, y)
    else:
        raise SystemExit(f"unknown benchmark {bench}")
    result = measure(lambda: jax.block_until_ready(f(*args)), repeats, warmup)  # as on spmdsim's side
    print(json.dumps({**result, "jax": jax.__version__}))


if __name__ == "__main__":
    main()
