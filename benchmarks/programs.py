"""The benchmarked programs, written once for each side: NumPy front end, JAX (both spmdsim.jax and jax.pmap)."""
import numpy as np

CHAIN = 100          # psums chained inside one mapped call (latency)
BIG = 4 * 1024 * 1024  # float32 elements per block: 16 MiB


def numpy_chain(lax):
    def f(x):
        for _ in range(CHAIN):
            x = lax.psum(x, "i") * np.float32(0.125)
        return x
    return f


def jax_chain(lax):
    def f(x):
        for _ in range(CHAIN):
            x = lax.psum(x, "i") * 0.125
        return x
    return f


def numpy_train_step(lax):
    def step(params, x, y):
        w, b = params
        err = x @ w + b - y
        loss = np.mean(err * err)
        grads = (2.0 * x.T @ err / len(y), 2.0 * np.mean(err))
        loss, grads = lax.pmean((loss, grads), "i")
        return tuple(p - np.float32(0.1) * g for p, g in zip(params, grads)), loss
    return step


def jax_train_step(jax):
    import jax.numpy as jnp

    def loss_fn(params, x, y):
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        loss, grads = jax.lax.pmean((loss, grads), "i")
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss
    return step


def train_data(n, per_device=64, features=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, per_device, features)).astype(np.float32)
    y = rng.standard_normal((n, per_device)).astype(np.float32)
    return x, y


def jax_loss(jax):
    """The per-device loss of the training step, pmapped with in_axes=(None, 0, 0): its grad is taken
    outside the pmap (the "grad" benchmark)."""
    import jax.numpy as jnp

    def loss(params, x, y):
        return jax.lax.pmean(jnp.mean((x @ params["w"] + params["b"] - y) ** 2), "i")
    return loss


def grad_of_pmap(jax, pmap):
    """``jax.grad`` of the summed pmapped loss with respect to the replicated parameters."""
    losses = pmap(jax_loss(jax), "i", in_axes=(None, 0, 0))
    return jax.grad(lambda params, x, y: losses(params, x, y).sum())


def jit_of_pmap(jax, pmap):
    """``jax.jit(jax.pmap(step))`` of the training step."""
    return jax.jit(pmap(jax_train_step(jax), "i", in_axes=(None, 0, 0), out_axes=None))


STEPS = 1000  # steps of the "many small calls" training loop


def training_loop(step, params, x, y, steps: int = STEPS, block=lambda value: value):
    """``steps`` calls of the mapped training ``step``, each on the previous step's parameters (what a user's
    loop does); returns the last loss. ``block(loss)`` after each step (jax.pmap: jax.block_until_ready)."""
    loss = None
    for _ in range(steps):
        params, loss = step(params, x, y)
        block(loss)
    return loss


def jax_cnn_step(image_size=16):
    """A flax CNN training step (conv, cross-device BatchNorm, max and average pooling, SGD with momentum;
    gradients and loss pmean'd), as in examples/jax/cnn_batchnorm.py, on (image_size, image_size, 1) images.
    Returns (step, params, batch_stats, opt_state) for the pmapped signature step(params, batch_stats,
    opt_state, images, labels)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.relu(nn.BatchNorm(use_running_average=not train, axis_name="i")(nn.Conv(8, (3, 3))(x)))
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
            x = nn.avg_pool(nn.relu(nn.Conv(16, (3, 3))(x)), (2, 2), strides=(2, 2))
            return nn.Dense(10)(x.reshape((x.shape[0], -1)))

    model, tx = CNN(), optax.sgd(0.05, momentum=0.9)

    def step(params, batch_stats, opt_state, images, labels):
        def loss_fn(p):
            logits, updates = model.apply({"params": p, "batch_stats": batch_stats}, images, train=True,
                                          mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), updates["batch_stats"]
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        grads, loss = jax.lax.pmean((grads, loss), "i")
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss

    variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, image_size, image_size, 1)), train=False)
    return step, variables["params"], variables["batch_stats"], tx.init(variables["params"])


def cnn_data(n, per_device=16, image_size=16, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((n, per_device, image_size, image_size, 1)).astype(np.float32)
    labels = rng.integers(0, 10, (n, per_device)).astype(np.int32)
    return images, labels


# -- shard_map: a data x model parallel linear model on a (4, 2) mesh ----------------------------------------

MESH_SHAPE = (4, 2)   # ('data', 'model')


def shard_map_data(features=16, per_device=32, seed=0):
    """Rows split over 'data', the weight's columns over 'model' (the global arrays)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((MESH_SHAPE[0] * per_device, features)).astype(np.float32)
    y = rng.standard_normal((MESH_SHAPE[0] * per_device, MESH_SHAPE[1] * 4)).astype(np.float32)
    w = np.zeros((features, MESH_SHAPE[1] * 4), np.float32)
    return w, x, y


def shard_map_step(lax, numpy):
    """One SGD step of a linear model: each device holds a block of rows and a block of the weight's columns;
    the gradient's rows are averaged over 'data' (pmean), the loss summed over 'model' then averaged."""
    def step(w, x, y):
        err = x @ w - y
        grad = x.T @ err * (2.0 / err.size)
        loss = lax.pmean(lax.psum(numpy.mean(err * err), "model"), "data")
        return w - 0.1 * lax.pmean(grad, "data"), loss
    return step


def mesh64_program(lax):
    """One psum over the first axis of a (64, 64) mesh (4096 devices), on (4,) blocks."""
    return lambda b: lax.psum(b, "x")


# -- issue 27: training steps whose devices do real work (large matmuls, convolutions, attention) ------------

MLP_SIZES = (784, 1024, 1024, 10)


def jax_mlp_step():
    """JAX's examples/spmd_mnist_classifier_fromscratch.py: an MLP 784-1024-1024-10 (tanh, log-softmax),
    ``jax.grad`` of the cross-entropy, the gradients psum'd over the devices, SGD ``w - 0.001 * dw``; the
    parameters replicated (one copy per device, in_axes=0), as the example does."""
    import jax
    import jax.numpy as jnp

    def predict(params, x):
        for w, b in params[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = params[-1]
        logits = x @ w + b
        return logits - jax.nn.logsumexp(logits, axis=1, keepdims=True)

    def loss(params, batch):
        x, y = batch
        return -jnp.mean(jnp.sum(predict(params, x) * y, axis=1))

    def step(params, batch):
        grads = jax.lax.psum(jax.grad(loss)(params, batch), "i")
        return [(w - 0.001 * dw, b - 0.001 * db) for (w, b), (dw, db) in zip(params, grads)]
    return step


def mlp_data(n, per_device=16, seed=0):
    """(replicated parameters, (images, one-hot labels)), each with a leading device axis."""
    rng = np.random.default_rng(seed)
    params = [(np.repeat(0.01 * rng.standard_normal((1, m, k), np.float32), n, axis=0), np.zeros((n, k), np.float32))
              for m, k in zip(MLP_SIZES[:-1], MLP_SIZES[1:])]
    x = rng.standard_normal((n, per_device, MLP_SIZES[0])).astype(np.float32)
    y = np.eye(MLP_SIZES[-1], dtype=np.float32)[rng.integers(0, MLP_SIZES[-1], (n, per_device))]
    return params, (x, y)


SEQ, D_MODEL, HEADS, D_MLP = 128, 256, 4, 1024


def jax_transformer_step():
    """One pre-LayerNorm transformer block (4-head self-attention, LayerNorm, a 1024-wide GELU MLP) trained by
    optax.adamw on a regression of random targets; gradients and loss pmean'd. Returns (step, params,
    opt_state) for the pmapped signature step(params, opt_state, x, y)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS)(h, h)
            h = nn.LayerNorm()(x)
            return x + nn.Dense(D_MODEL)(nn.gelu(nn.Dense(D_MLP)(h)))

    model, tx = Block(), optax.adamw(1e-3)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        grads, loss = jax.lax.pmean((grads, loss), "i")
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, SEQ, D_MODEL)))
    return step, params, tx.init(params)


def transformer_data(n, per_device=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, per_device, SEQ, D_MODEL)).astype(np.float32)
    return x, rng.standard_normal(x.shape).astype(np.float32)


WORK = ("mlp", "cnn32", "transformer")


def work_program(name, n):
    """One of issue 27's steps at n devices, the same call for spmdsim.jax.pmap and jax.pmap: returns
    (step, in_axes, out_axes, args) for ``pmap(step, "i", in_axes=in_axes, out_axes=out_axes)(*args)``."""
    if name == "mlp":
        return jax_mlp_step(), 0, 0, mlp_data(n)
    if name == "cnn32":  # batch 32 per device of MNIST-sized images
        step, params, stats, opt_state = jax_cnn_step(image_size=28)
        return step, (None, None, None, 0, 0), None, (params, stats, opt_state, *cnn_data(n, 32, 28))
    if name == "transformer":
        step, params, opt_state = jax_transformer_step()
        return step, (None, None, 0, 0), None, (params, opt_state, *transformer_data(n))
    raise ValueError(name)
