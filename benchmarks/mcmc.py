"""MCMC chains, one per device (issue 43): long ``while_loop``s of small operations, measured end to end as a user
runs them (a fresh process; tracing and compiling included).

``python benchmarks/mcmc.py numpyro|blackjax [SAMPLES]`` prints one JSON line: ``seconds`` (the sampler's run,
from building it to its samples on the host) and ``digest`` (a hash of the samples' bytes: the same under every
executor of spmdsim, bit for bit). Run it under JAX with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
and under ``spmdsim run --devices 4 [--executor vectorized]``; ``python -m benchmarks --only nuts`` runs all three.

- ``numpyro``: issue 43's program, NUTS on a logistic regression, ``num_chains=4, chain_method="parallel"`` (a
  ``jax.pmap`` of the whole chain), SAMPLES warm-up steps and SAMPLES samples per chain.
- ``blackjax``: blackjax's NUTS on the same model with a fixed step size, 4 chains over a ``jax.shard_map`` (one
  chain per device) under ``jax.jit``, SAMPLES steps per chain in a ``lax.scan``.
"""
import hashlib
import json
import sys
import time

import numpy as np

CHAINS = 4


def data():
    rng = np.random.RandomState(0)
    x = rng.randn(200, 3).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3 > 0).astype(np.float32)
    return x, y


def numpyro_nuts(samples: int) -> dict:
    import jax
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    def model(x, y=None):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([x.shape[1]]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0, 1))
        numpyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)

    x, y = data()
    start = time.perf_counter()
    mcmc = MCMC(NUTS(model), num_warmup=samples, num_samples=samples, num_chains=CHAINS, chain_method="parallel",
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), x, y)
    drawn = {k: np.asarray(v) for k, v in sorted(mcmc.get_samples().items())}
    return {"seconds": time.perf_counter() - start, "digest": _digest(drawn),
            "w_mean": drawn["w"].mean(0).round(3).tolist()}


def blackjax_nuts(samples: int) -> dict:
    import blackjax
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    x, y = data()

    def logdensity(position):
        logits = x @ position["w"] + position["b"]
        likelihood = jnp.sum(y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits))
        prior = -0.5 * (jnp.sum(position["w"] ** 2) + position["b"] ** 2)
        return likelihood + prior

    kernel = blackjax.nuts(logdensity, step_size=0.2, inverse_mass_matrix=jnp.ones(4))

    def chain(key, w0, b0):  # one chain: SAMPLES NUTS steps
        state = kernel.init({"w": w0, "b": b0})

        def step(state, key):
            state, _ = kernel.step(key, state)
            return state, state.position

        _, positions = jax.lax.scan(step, state, jax.random.split(key, samples))
        return positions

    def per_device(keys, w0, b0):  # this device's block: one chain
        positions = chain(keys[0], w0[0], b0[0])
        return jax.tree_util.tree_map(lambda p: p[None], positions)

    start = time.perf_counter()
    mesh = jax.make_mesh((CHAINS,), ("chain",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:CHAINS])
    run = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("chain"),) * 3, out_specs=P("chain"),
                                  check_vma=False))  # blackjax builds its trees from unvarying constants
    keys = jax.random.split(jax.random.PRNGKey(0), CHAINS)
    w0 = np.random.RandomState(1).randn(CHAINS, 3).astype(np.float32) * 0.1
    drawn = {k: np.asarray(v) for k, v in sorted(run(keys, w0, np.zeros(CHAINS, np.float32)).items())}
    return {"seconds": time.perf_counter() - start, "digest": _digest(drawn),
            "w_mean": drawn["w"].reshape(-1, 3).mean(0).round(3).tolist()}


def _digest(drawn: dict) -> str:
    h = hashlib.sha256()
    for k, v in drawn.items():
        h.update(k.encode() + str(v.dtype).encode() + str(v.shape).encode() + v.tobytes())
    return h.hexdigest()[:16]


PROGRAMS = {"numpyro": numpyro_nuts, "blackjax": blackjax_nuts}


def main():
    name = sys.argv[1]
    samples = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    print(json.dumps(PROGRAMS[name](samples)))


if __name__ == "__main__":
    main()
