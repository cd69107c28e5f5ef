"""``spmdsim demo``: data-parallel linear regression on the diabetes table, on virtual devices.

The seed pattern of synchronous data-parallel training: the rows are sharded over the devices, the
parameters are replicated, every device computes the loss and gradient on its own rows, ``pmean`` averages
them over the named axis, and every device applies the same update. The result is compared with
``numpy.linalg.lstsq`` on the same standardized data.

Remainder rows: 442 patients rarely divide evenly by the device count, so every device gets
``ceil(442 / N)`` rows and the missing ones are padding with weight 0. Each device scales its sums by
``N / 442``, so ``pmean`` gives exactly the full-batch mean over all 442 patients: no patient is dropped or
counted twice.
"""
from __future__ import annotations

import math
import sys
import time
from importlib import resources

import numpy as np

import spmdsim
from spmdsim import lax

AXIS = "batch"
DIVERGED = 100.0  # a loss this many times the first one means the training diverged


def load_diabetes() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The 442 x 10 feature matrix, the response ``progression`` and the feature names (float64)."""
    with resources.files("spmdsim").joinpath("data/diabetes.csv").open() as f:
        header = f.readline().strip().split(",")
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1], table[:, -1], header[:-1]


def standardize(a: np.ndarray) -> np.ndarray:
    return (a - a.mean(axis=0)) / a.std(axis=0)


def shard_rows(x: np.ndarray, y: np.ndarray, n_devices: int):
    """Split rows over devices: shapes ``(N, R, F)``, ``(N, R)`` and a 0/1 weight mask ``(N, R)``, with
    ``R = ceil(rows / N)``; the padding rows (at the end of the last devices) have weight 0."""
    rows = len(x)
    per = -(-rows // n_devices)
    pad = per * n_devices - rows
    xp = np.concatenate([x, np.zeros((pad, x.shape[1]))])
    yp = np.concatenate([y, np.zeros(pad)])
    mask = np.concatenate([np.ones(rows), np.zeros(pad)])
    return xp.reshape(n_devices, per, -1), yp.reshape(n_devices, per), mask.reshape(n_devices, per)


def train_step(params, velocity, x, y, mask, scale, lr, momentum):
    """One device's step: local loss and gradient, ``pmean`` over the devices, momentum update."""
    err = (x @ params["w"] + params["b"] - y) * mask
    loss = scale * 0.5 * np.sum(err * err)
    grads = {"w": scale * (x.T @ err), "b": scale * np.sum(err)}
    loss, grads = lax.pmean((loss, grads), AXIS)
    velocity = {k: momentum * velocity[k] - lr * grads[k] for k in params}
    params = {k: params[k] + velocity[k] for k in params}
    return params, velocity, loss


def run(devices: int = 8, steps: int = 500, lr: float = 0.1, momentum: float = 0.95, log_every: int = 50,
        echo=print) -> dict:
    """Train on ``devices`` virtual devices and report each step of the way through ``echo``.

    Args:
        devices: number of virtual devices the rows are sharded over.
        steps: training steps.
        lr: learning rate.
        momentum: heavy-ball momentum.
        log_every: print the loss every this many steps.
        echo: called with each line of the report.

    Returns:
        A dict: ``learned`` and ``reference`` (lstsq's) weights with the bias last, ``gap`` (the largest
        difference between them), ``losses`` per step, ``best_loss`` (lstsq's), ``identical`` (replicas stayed
        bitwise equal), ``counts`` (collectives run) and ``diverged`` (the step where the loss blew up, or
        None).
    """
    x_raw, y_raw, names = load_diabetes()
    x, y = standardize(x_raw), standardize(y_raw)
    rows = len(x)
    xs, ys, mask = shard_rows(x, y, devices)
    per = xs.shape[1]
    pad = per * devices - rows
    idle = pad // per  # devices whose rows are all padding
    echo(f"diabetes: {rows} patients x {len(names)} features, standardized; {devices} virtual devices, "
         f"{per} row{'s' * (per != 1)} each" + (f" ({pad} padding rows with weight 0 on the last device(s), so every "
                                                f"patient counts exactly once" if pad else "")
         + (f"; the last {idle} devices hold only padding: fewer devices would do the same work faster)"
            if idle else ")" if pad else ""))
    echo("each step: every device computes the loss and gradient on its own rows, pmean averages them over the "
         "devices, and every device applies the same update")
    echo("loss: half the mean squared error over all patients (standardized units: predicting the mean scores "
         "0.5, lower is better)")

    step = spmdsim.pmap(train_step, axis_name=AXIS, in_axes=(None, None, 0, 0, 0, None, None, None))
    params = {"w": np.zeros(x.shape[1]), "b": np.zeros(())}
    velocity = {"w": np.zeros(x.shape[1]), "b": np.zeros(())}
    scale = devices / rows
    losses, identical, diverged = [], True, None
    start = time.perf_counter()
    with spmdsim.trace() as tr, spmdsim.reuse_threads():  # the same device threads for every step
        for i in range(1, steps + 1):
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging run overflows; reported below
                p, v, loss = step(params, velocity, xs, ys, mask, scale, lr, momentum)
            # out_axes=0 stacks every device's copy: check that they stayed bitwise identical.
            identical &= all(np.array_equal(a, np.broadcast_to(a[0], a.shape)) for a in (p["w"], p["b"], loss))
            params = {k: p[k][0] for k in p}
            velocity = {k: v[k][0] for k in v}
            losses.append(float(loss[0]))
            if i == 1 or i % log_every == 0 or i == steps:
                echo(f"step {i:4d}  loss {losses[-1]:.6f}")
            if not math.isfinite(losses[-1]) or losses[-1] > DIVERGED * losses[0]:
                diverged = i
                break
    elapsed = time.perf_counter() - start

    design = np.c_[x, np.ones(rows)]
    reference = np.linalg.lstsq(design, y, rcond=None)[0]
    best_loss = float(0.5 * np.mean((design @ reference - y) ** 2))
    learned = np.r_[params["w"], params["b"]]
    gap = float(np.max(np.abs(learned - reference)))
    counts = tr.counts()
    result = {"learned": learned, "reference": reference, "gap": gap, "losses": losses, "best_loss": best_loss,
              "identical": identical, "counts": counts, "diverged": diverged}
    if diverged is not None:
        echo(f"diverged: the loss grew from {losses[0]:.3g} at step 1 to {losses[-1]:.3g} at step {diverged}, so "
             f"training stopped. The learning rate {lr:g} is too large: each update overshoots the minimum by more "
             f"than it corrects. Try a smaller one, e.g. --lr 0.1 (the default).")
        return result
    echo(f"parameters bitwise identical on all {devices} devices after every step: {'yes' if identical else 'NO'}")
    echo("collectives run: " + ", ".join(f"{op} x {c}" for op, c in sorted(counts.items()))
         + f" (pmean is psum / n; {len(losses)} step{'s' * (len(losses) != 1)} in {elapsed:.2f} s)")
    echo(f"final loss {losses[-1]:.6f}; the best possible (numpy.linalg.lstsq's exact least-squares fit) is "
         f"{best_loss:.6f}")
    echo(f"lstsq gap: {gap:.3g} (the largest difference between the learned weights and lstsq's; "
         + ("below 1e-3: training found the same fit" if gap < 1e-3 else "train longer (--steps) to close it") + ")")
    return result


ROWS = 442  # the diabetes table's patients


def _finite(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    """argparse type: a finite number greater than 0 (the learning rate)."""
    import argparse

    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number greater than 0, got {text}")
    return value


def _momentum(text: str) -> float:
    """argparse type: a finite number in [0, 1) (heavy-ball momentum; 1 or more never settles)."""
    import argparse

    value = _finite(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
    return value


WHAT_NEXT = """what next:
  spmdsim demo --devices 3
      the same on 3 devices: uneven shards, the same answer
  spmdsim demo --lr 5
      a learning rate too large: the loss diverges
  spmdsim debug -m spmdsim.demo --steps 2
      stop at each pmean: every device's loss and gradient side by side (n: next, h: help)
  {source}
      this demo's code: train_step is the data-parallel step
  docs/tutorial/*.ipynb in spmdsim's repository
      tutorial notebooks: what SPMD is, in_axes/out_axes, collectives, a training loop, a deadlock"""


def main(argv: list[str] | None = None) -> int:
    """``spmdsim demo``: returns 0, or 1 when the training diverged.

    Raises:
        UsageError: bad options.
    """
    from spmdsim.cli import ArgumentParser, UsageError, positive_int

    parser = ArgumentParser(prog="spmdsim demo", description="Data-parallel linear regression on the diabetes table "
                            "(442 patients) over virtual devices, checked against numpy.linalg.lstsq.")
    parser.add_argument("--devices", type=positive_int, default=8, metavar="N",
                        help="number of virtual devices (default 8)")
    parser.add_argument("--steps", type=positive_int, default=500, help="training steps (default 500)")
    parser.add_argument("--lr", type=_positive_float, default=0.1, help="learning rate, a number > 0 (default 0.1)")
    parser.add_argument("--momentum", type=_momentum, default=0.95,
                        help="heavy-ball momentum, a number in [0, 1) (default 0.95)")
    args = parser.parse_args(argv)
    if args.devices > ROWS:
        raise UsageError(f"--devices {args.devices}: the table has {ROWS} patients, so each device gets 1 row and "
                         f"{args.devices - ROWS} devices would hold only padding (rows with weight 0). Give at most "
                         f"{ROWS} devices.")
    with spmdsim.set_device_count(max(args.devices, spmdsim.device_count())):
        result = run(args.devices, args.steps, args.lr, args.momentum)
    print()
    print(WHAT_NEXT.format(source=__file__))
    return 0 if result["diverged"] is None else 1


if __name__ == "__main__":  # spmdsim debug -m spmdsim.demo
    sys.exit(main())
