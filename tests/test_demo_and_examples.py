"""The demo and the seed-pattern examples: the seeds' worked numbers, and the seeds' mistakes rejected."""
import os
import subprocess
import sys

import numpy as np
import pytest

import spmdsim
from spmdsim import demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import elementwise, in_out_axes, named_psum, predict_broadcast, training_loop  # noqa: E402


def test_demo_converges_to_lstsq_with_identical_replicas():
    lines = []
    result = demo.run(echo=lines.append)
    assert result["gap"] < 1e-3
    assert result["identical"]
    assert result["counts"] == {"pmean": 500}          # one pmean of (loss, grads) per step, counted by its name
    assert lines[-1].startswith("lstsq gap: ") and float(lines[-1].split()[2]) == pytest.approx(result["gap"], rel=1e-2)
    assert "largest difference between the learned weights and lstsq's" in lines[-1]
    assert any(line.startswith("loss: half the mean squared error") for line in lines)
    assert f"the best possible (numpy.linalg.lstsq's exact least-squares fit) is {result['best_loss']:.6f}" in lines[-2]
    assert result["diverged"] is None
    assert "6 padding rows with weight 0" in lines[0]
    assert result["losses"][-1] < result["losses"][0]


def test_demo_gradient_equals_full_batch_gradient_for_any_device_count():
    x_raw, y_raw, _ = demo.load_diabetes()
    x, y = demo.standardize(x_raw), demo.standardize(y_raw)
    params = {"w": np.linspace(-1, 1, 10), "b": np.float64(0.3)}
    zero = {"w": np.zeros(10), "b": np.zeros(())}
    full_grad_w = x.T @ (x @ params["w"] + params["b"] - y) / len(x)
    for n in (1, 3, 7, 8):
        xs, ys, mask = demo.shard_rows(x, y, n)
        assert mask.sum() == 442
        with spmdsim.set_device_count(n):
            step = spmdsim.pmap(demo.train_step, axis_name=demo.AXIS, in_axes=(None, None, 0, 0, 0, None, None, None))
            p, v, loss = step(params, zero, xs, ys, mask, n / 442, 1.0, 0.0)
        np.testing.assert_allclose(-v["w"][0], full_grad_w, rtol=1e-10, atol=1e-12)


def test_demo_command_line():
    out = subprocess.run([sys.executable, "-m", "spmdsim", "demo", "--devices", "3", "--steps", "400"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "3 virtual devices, 148 rows each (2 padding rows" in out.stdout
    gap_line = next(line for line in out.stdout.splitlines() if line.startswith("lstsq gap: "))
    assert float(gap_line.split()[2]) < 1e-3
    assert "what next:\n  spmdsim demo --devices 3\n" in out.stdout


def test_demo_says_when_the_training_diverges():
    out = subprocess.run([sys.executable, "-m", "spmdsim", "demo", "--lr", "5"], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert out.returncode == 1, out.stderr
    assert "diverged: the loss grew from 0.5 at step 1 to 58.7 at step 2, so training stopped. The learning rate 5 " \
           "is too large" in out.stdout
    assert "lstsq gap" not in out.stdout and not out.stderr


def test_named_psum_seed_numbers():
    data, result = named_psum.main(4)
    assert result.tolist() == [12.0] * 4          # psum(2 * [0, 1, 2, 3]) = 12 on every device
    assert named_psum.main(2)[1].tolist() == [2.0, 2.0]


def test_in_out_axes_seed_numbers_and_the_chunking_mistake():
    with spmdsim.set_device_count(2):
        data, result, swapped = in_out_axes.main(2)
        # the seed's expected output: arange(12).reshape(4, 3) * 10
        np.testing.assert_array_equal(result.reshape(4, 3), np.arange(12).reshape(4, 3) * 10.0)
        assert swapped.shape == (2, 2, 3)
        np.testing.assert_array_equal(swapped, np.swapaxes(result, 0, 1))
        with pytest.raises(ValueError, match=r"never splits an axis into chunks: reshape the input to \(2, 2, \.\.\.\)"):
            spmdsim.pmap(in_out_axes.scale, in_axes=(0, None))(np.arange(12.).reshape(4, 3), 10.0)


def test_predict_broadcast_matches_unsharded_numpy():
    params, batch, predictions = predict_broadcast.main()
    assert predictions.shape == (8, 32, 5)
    np.testing.assert_allclose(predictions.reshape(-1, 5), batch @ params["w"] + params["b"], rtol=1e-12)


def test_training_loop_learns_and_stays_replicated():
    (w, b), (true_w, true_b), losses, (x, y) = training_loop.main(steps=300)
    ref = np.linalg.lstsq(np.c_[x, np.ones(len(x))], y, rcond=None)[0]
    np.testing.assert_allclose(np.r_[w, b], ref, atol=1e-6)
    assert losses[-1] < losses[0]


def test_training_loop_seed_mistakes_are_rejected_with_a_fix():
    # Replicating parameters with pmap(lambda x: x, in_axes=None): no mapped argument.
    with pytest.raises(ValueError, match="requires at least one argument with a mapped axis.*np.broadcast_to"):
        spmdsim.pmap(lambda p: p, in_axes=None)(np.zeros(3))
    # Scalar parameters passed with the default in_axes=0 (seed 000's update step).
    with pytest.raises(ValueError, match=r"args\[0\]\['b'\].*scalar.*in_axes=None"):
        spmdsim.pmap(lambda p, batch: p, axis_name="d")({"w": np.ones(()), "b": np.zeros(())}, np.zeros((8, 4)))


def test_elementwise_and_the_one_device_mistake():
    data, result = elementwise.main()
    np.testing.assert_array_equal(result, data * 2)
    assert result.dtype == data.dtype
    with spmdsim.set_device_count(1):
        with pytest.raises(ValueError, match="only 1 virtual devices"):
            spmdsim.pmap(elementwise.simple_computation)(np.arange(6).reshape(2, 3))
        assert spmdsim.pmap(elementwise.simple_computation)(np.arange(3).reshape(1, 3)).tolist() == [[0, 2, 4]]


@pytest.mark.parametrize("option, message", [
    (["--lr", "-1"], "argument --lr: expected a number greater than 0, got -1"),
    (["--lr", "nan"], "argument --lr: expected a finite number, got 'nan'"),
    (["--momentum", "1"], "argument --momentum: expected a number in [0, 1), got 1"),
    (["--devices", "1000"], "--devices 1000: the table has 442 patients, so each device gets 1 row and 558 devices "
                            "would hold only padding (rows with weight 0). Give at most 442 devices."),
])
def test_demo_refuses_values_that_cannot_work_at_once(option, message):
    out = subprocess.run([sys.executable, "-m", "spmdsim", "demo", *option], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not out.stdout and "too large" not in out.stderr


def test_demo_says_which_devices_hold_only_padding_and_where_the_notebooks_are():
    lines = []
    with spmdsim.set_device_count(250):
        demo.run(devices=250, steps=1, echo=lines.append)
    assert "250 virtual devices, 2 rows each (58 padding rows with weight 0 on the last device(s), so every patient " \
           "counts exactly once; the last 29 devices hold only padding: fewer devices would do the same work " \
           "faster)" in lines[0]
    assert "docs/tutorial/*.ipynb in spmdsim's repository" in demo.WHAT_NEXT
    assert os.path.isdir(os.path.join(ROOT, "docs", "tutorial")) and not os.path.exists(os.path.join(ROOT, "docs",
                                                                                                      "1_what_is_spmd.ipynb"))


def test_debugging_tour_says_where_it_wrote_its_two_files(tmp_path, capsys):
    import runpy

    runpy.run_path(os.path.join(ROOT, "examples", "debugging_tour.py"))["main"](str(tmp_path))
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'ring_trace.json'} (open it at https://ui.perfetto.dev)\n" in out
    assert f"wrote {tmp_path / 'ring_timeline.svg'} (the timeline: open it in a browser)\n" in out
    assert (tmp_path / "ring_trace.json").exists() and (tmp_path / "ring_timeline.svg").exists()
