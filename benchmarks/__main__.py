"""``python -m benchmarks [--quick] [--busy] [--only NAME] [--out FILE]``: spmdsim and jax.pmap side by side.

For each benchmark and device count: the median of repeated calls (after a first call, whose time is shown
separately: for jax.pmap and the JAX front end that is trace + compile), and the ratio spmdsim / jax.
jax.pmap runs in a subprocess per device count with that many forced CPU devices; a run that exceeds its
time limit is reported as such. Each row shows the machine's 1-minute load average at its end; with --busy,
each row is measured twice, quiet and with a second process busy-looping on one core (benchmarks/busy.py).
Results (with machine and version information) go to a JSON file.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

import spmdsim
from benchmarks import programs
from benchmarks.busy import busy_process
from benchmarks.timing import WARMUP, measure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jax_side(bench: str, n: int, repeats: int, timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.jax_side", bench, str(n), str(repeats),
                               str(0 if bench == "steps" else _warmup(n))],
                              capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:.0f} s (compile + {repeats} calls)"}
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error" in ln]
        return {"error": (lines[-1] if lines else f"exit {proc.returncode}").strip()[:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _warmup(n: int) -> int:
    return 1 if n >= 1024 else WARMUP


def spmdsim_side(bench: str, n: int, variant: str, repeats: int) -> dict:
    import jax

    import spmdsim.jax as sjax
    executor = "vectorized" if variant == "jax-vectorized" else "threads"
    with spmdsim.set_device_count(max(n, 8)):
        if bench == "latency":
            x = np.ones((n, 4), np.float32)
            f = (spmdsim.pmap(programs.numpy_chain(spmdsim.lax), "i") if variant == "numpy"
                 else sjax.pmap(programs.jax_chain(jax.lax), "i", executor=executor))
            return measure(lambda: f(x), repeats, _warmup(n))
        if bench == "large":
            x = np.ones((n, programs.BIG), np.float32)
            f = (spmdsim.pmap(lambda v: spmdsim.lax.psum(v, "i"), "i", out_axes=None) if variant == "numpy"
                 else sjax.pmap(lambda v: jax.lax.psum(v, "i"), "i", out_axes=None, executor=executor))
            return measure(lambda: f(x), repeats, _warmup(n))
        if bench == "train":
            x, y = programs.train_data(n)
            if variant == "numpy":
                f = spmdsim.pmap(programs.numpy_train_step(spmdsim.lax), "i", in_axes=(None, 0, 0), out_axes=None)
                params = (np.zeros(x.shape[-1], np.float32), np.zeros((), np.float32))
            else:
                f = sjax.pmap(programs.jax_train_step(jax), "i", in_axes=(None, 0, 0), out_axes=None, executor=executor)
                params = {"w": np.zeros(x.shape[-1], np.float32), "b": np.zeros((), np.float32)}
            return measure(lambda: f(params, x, y), repeats, _warmup(n))
        if bench in ("grad", "jit"):
            if variant == "numpy":
                return {"error": "not applicable: a JAX transformation of a pmap"}
            make = programs.grad_of_pmap if bench == "grad" else programs.jit_of_pmap
            f = make(jax, functools.partial(sjax.pmap, executor=executor))
            x, y = programs.train_data(n)
            params = {"w": np.zeros(x.shape[-1], np.float32), "b": np.zeros((), np.float32)}
            return measure(lambda: jax.block_until_ready(f(params, x, y)), repeats, _warmup(n))
        if bench == "shard_map":
            w, x, y = programs.shard_map_data()
            if variant == "numpy":
                mesh, P = spmdsim.make_mesh(programs.MESH_SHAPE, ("data", "model")), spmdsim.P
                f = spmdsim.shard_map(programs.shard_map_step(spmdsim.lax, np), mesh=mesh,
                                      in_specs=(P(None, "model"), P("data"), P("data", "model")),
                                      out_specs=(P(None, "model"), P()))
            else:  # jax.jit(jax.shard_map(...)) as spmdsim runs it (`spmdsim run` gives jit the same path)
                from jax.sharding import AbstractMesh, PartitionSpec as P
                mesh = AbstractMesh(programs.MESH_SHAPE, ("data", "model"))  # spmdsim needs no JAX devices
                f = sjax.shard_map(programs.shard_map_step(jax.lax, jax.numpy), mesh=mesh,
                                   in_specs=(P(None, "model"), P("data"), P("data", "model")),
                                   out_specs=(P(None, "model"), P()), executor=executor)
                f = sjax.jit(f) if executor == "threads" else f
            return measure(lambda: jax.block_until_ready(f(w, x, y)), repeats, _warmup(n))
        if bench == "mesh64":
            if variant != "jax-vectorized":
                return {"error": "vectorized executor only (4096 device threads per call)"}
            from jax.sharding import AbstractMesh, PartitionSpec as P
            mesh = AbstractMesh((64, 64), ("x", "y"))
            f = sjax.shard_map(programs.mesh64_program(jax.lax), mesh=mesh, in_specs=P(("x", "y")),
                               out_specs=P("y"), check_vma=False, executor="vectorized")
            x = np.ones((4096 * 4,), np.float32)
            return measure(lambda: jax.block_until_ready(f(x)), repeats, _warmup(n))
        if bench in programs.WORK:
            if variant == "numpy":
                return {"error": "no NumPy front end version (jax.grad of a JAX program)"}
            step, in_axes, out_axes, args = programs.work_program(bench, n)
            f = sjax.pmap(step, "i", in_axes=in_axes, out_axes=out_axes, executor=executor)
            return measure(lambda: jax.block_until_ready(f(*args)), repeats, _warmup(n))
        if bench == "cnn":
            if variant == "numpy":
                return {"error": "no NumPy front end version (a flax model)"}
            step, params, stats, opt_state = programs.jax_cnn_step()
            images, labels = programs.cnn_data(n)
            f = sjax.pmap(step, "i", in_axes=(None, None, None, 0, 0), out_axes=None, executor=executor)
            return measure(lambda: f(params, stats, opt_state, images, labels), repeats, _warmup(n))
        if bench == "scale":
            x = np.ones((n, 4), np.float32)
            f = (spmdsim.pmap(lambda v: spmdsim.lax.psum(v, "i"), "i") if variant == "numpy"
                 else sjax.pmap(lambda v: jax.lax.psum(v, "i"), "i", executor=executor))
            return measure(lambda: f(x), repeats, _warmup(n))
    raise ValueError(bench)


def spmdsim_small_calls(bench: str, n: int, variant: str, repeats: int) -> dict:
    """The benchmarks of what users feel (issue 15), at default settings: "call" is one psum of an (n, 4)
    float32 array per call; "steps" is a 1000-step training loop calling the mapped step each step."""
    import jax

    import spmdsim.jax as sjax
    executor = "vectorized" if variant == "jax-vectorized" else "threads"
    with spmdsim.set_device_count(max(n, 8)):
        if bench == "call":
            x = np.ones((n, 4), np.float32)
            f = (spmdsim.pmap(lambda v: spmdsim.lax.psum(v, "i"), "i") if variant == "numpy"
                 else sjax.pmap(lambda v: jax.lax.psum(v, "i"), "i", executor=executor))
            return measure(lambda: f(x), repeats, _warmup(n))
        x, y = programs.train_data(n)
        if variant == "numpy":
            step = spmdsim.pmap(programs.numpy_train_step(spmdsim.lax), "i", in_axes=(None, 0, 0), out_axes=None)
            params = (np.zeros(x.shape[-1], np.float32), np.zeros((), np.float32))
        else:
            step = sjax.pmap(programs.jax_train_step(jax), "i", in_axes=(None, 0, 0), out_axes=None, executor=executor)
            params = {"w": np.zeros(x.shape[-1], np.float32), "b": np.zeros((), np.float32)}
        return measure(lambda: programs.training_loop(step, params, x, y), repeats, 0, min_time=0)


def numpy_bound(repeats: int) -> dict:
    """One add-reduce over the same 8 x 16 MiB float32 data, in a single thread."""
    x = np.ones((8, programs.BIG), np.float32)
    return measure(lambda: np.add.reduce(x, axis=0), repeats)


PLAN = {  # benchmark -> device counts; every benchmark runs every variant
    "latency": [8, 64, 256, 1024],
    "large": [8],
    "train": [8, 64],
    "grad": [8],
    "jit": [8],
    "cnn": [8],
    "mlp": [8],
    "cnn32": [8],
    "transformer": [8],
    "shard_map": [8],
    "mesh64": [4096],
    "scale": [4096],
    "call": [8, 64],
    "steps": [8, 64],
    "nuts": [4],
    "blackjax": [4],
}
SMALL_CALLS = ("call", "steps")  # run by spmdsim_small_calls; "steps" times 1000 calls per measurement
END_TO_END = {"nuts": "numpyro", "blackjax": "blackjax"}  # benchmarks/mcmc.py programs, each run in a fresh process
VARIANTS = ["numpy", "jax-threads", "jax-vectorized"]


def machine() -> dict:
    import jax
    return {"python": platform.python_version(), "numpy": np.__version__, "jax": jax.__version__,
            "spmdsim": spmdsim.__version__, "machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "system": platform.platform(), "date": time.strftime("%Y-%m-%d"),
            "commit": subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small device counts and few repeats (a smoke run)")
    parser.add_argument("--only", action="append", choices=list(PLAN), help="run only these benchmarks")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--jax-timeout", type=float, default=240.0, help="seconds per jax.pmap subprocess")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results.json"))
    parser.add_argument("--markdown", metavar="JSON", help="print the Markdown table of an earlier run and exit")
    parser.add_argument("--fresh-threads", action="store_true",
                        help="start new device threads for every call (spmdsim.runtime._threads.REUSE = False, as "
                             "SPMDSIM_REUSE_THREADS=0; by default device threads are parked between calls)")
    parser.add_argument("--busy", action="store_true",
                        help="measure each row twice: quiet, then with a second process busy-looping on one core")
    args = parser.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)))
        return 0
    if args.fresh_threads:
        spmdsim.runtime._threads.REUSE = False
    plan = {k: ([8] if args.quick and k not in END_TO_END else v) for k, v in PLAN.items()
            if not args.only or k in args.only}
    repeats = 2 if args.quick else args.repeats
    rows = []
    for bench, sizes in plan.items():
        for n in sizes:
            reps = min(repeats, 3) if n >= 1024 else repeats
            if bench == "steps":
                reps = 2 if args.quick else 3
            for busy in ([False, True] if args.busy else [False]):
                with (busy_process() if busy else contextlib.nullcontext()):
                    row = measure_row(bench, n, reps, args)
                row.update(busy=busy, load=os.getloadavg()[0])
                rows.append(row)
                print_row(row)
                if busy:
                    quiet = rows[-2]
                    print("  busy / quiet: " + "  ".join(f"{v} {_ratio(row[v], quiet[v])}" for v in ["jax", *VARIANTS]))
    doc = {"machine": machine(), "rows": rows, "threads": "fresh per call" if args.fresh_threads else "reused",
           "notes": "medians of repeated calls (--repeats, 3 at >= 1024 devices, more until 0.5 s of timed calls) "
                     "after a first call and warm-up calls (3; 1 at >= 1024 devices); kernel_s: kernel CPU time per "
                     "call; times in seconds; ratio = spmdsim / jax"}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print_table(rows)
    print(f"results: {args.out}")
    return 0


def measure_row(bench: str, n: int, reps: int, args) -> dict:
    """One benchmark at n devices: jax.pmap (in its subprocess), then each spmdsim variant."""
    if bench in END_TO_END:
        return end_to_end_row(bench, n, args)
    row = {"benchmark": bench, "devices": n, "jax": jax_side(bench, n, reps, args.jax_timeout)}
    for variant in VARIANTS:
        if variant == "jax-threads" and bench == "latency" and n > 256:
            row[variant] = {"error": "skipped: 100 rendezvous x 1024 threads"}
            continue
        if bench in SMALL_CALLS:  # default settings: no reuse_threads() block
            row[variant] = spmdsim_small_calls(bench, n, variant, reps)
            continue
        with (contextlib.nullcontext() if args.fresh_threads else spmdsim.reuse_threads()):
            row[variant] = spmdsim_side(bench, n, variant, reps)
    if bench == "large":
        row["numpy-bound"] = numpy_bound(reps)
    return row


def end_to_end(command: list, env: dict, timeout: float) -> dict:
    """One run of a benchmarks/mcmc.py program in a fresh process, as a user runs it: its ``seconds`` (tracing
    and compiling included) as ``first_s`` and ``median_s``, the digest of its samples, and the CPU time of the
    whole process (``process_cpu_s``, user + system, start-up included: on a loaded machine a steadier measure
    than the wall time)."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:.0f} s"}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error" in ln]
        return {"error": (lines[-1] if lines else f"exit {proc.returncode}").strip()[:300]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"first_s": result["seconds"], "median_s": result["seconds"], "times_s": [result["seconds"]],
            "digest": result["digest"], "process_cpu_s": cpu}


def end_to_end_row(bench: str, n: int, args) -> dict:
    """MCMC chains (issue 43), one per device, end to end: JAX with n forced CPU devices, then ``spmdsim run
    --devices n`` with each executor (the JAX front end only: these programs call ``jax.pmap`` and
    ``jax.shard_map`` themselves). Samples per chain: 300 (100 with --quick)."""
    program = [os.path.join(ROOT, "benchmarks", "mcmc.py"), END_TO_END[bench], "100" if args.quick else "300"]
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    timeout = max(args.jax_timeout, 900.0)
    forced = {**env, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
    row = {"benchmark": bench, "devices": n, "jax": end_to_end([sys.executable, *program], forced, timeout),
           "numpy": {"error": "no NumPy front end version (numpyro and blackjax are JAX programs)"}}
    for variant, executor in (("jax-threads", "threads"), ("jax-vectorized", "vectorized")):
        row[variant] = end_to_end([sys.executable, "-m", "spmdsim", "run", "--devices", str(n), "--executor", executor,
                                   *program], env, timeout)
    digests = {row[v].get("digest") for v in ("jax-threads", "jax-vectorized")}
    if len(digests) != 1:
        row["jax-vectorized"] = {"error": f"samples differ from the thread executor's: {sorted(map(str, digests))}"}
    return row


def _name(row: dict) -> str:
    return row["benchmark"] + (", busy" if row.get("busy") else "")


def _load(row: dict) -> str:
    return f"{row['load']:.1f}" if "load" in row else ""


def _ms(result: dict) -> str:
    if "error" in result:
        return "—"
    return f"{1e3 * result['median_s']:.2f}"


def _kernel_ms(result: dict) -> str:
    return "—" if "kernel_median_s" not in result else f"{1e3 * result['kernel_median_s']:.1f}"


def _first(result: dict) -> str:
    return "—" if "error" in result else f"{1e3 * result['first_s']:.0f}"


def _ratio(ours: dict, theirs: dict) -> str:
    if "error" in ours or "error" in theirs:
        return "—"
    return f"{ours['median_s'] / theirs['median_s']:.2f}"


def print_row(row: dict) -> None:
    parts = [f"{v}={_ms(row[v])} ms" for v in VARIANTS]
    print(f"{_name(row):8s} N={row['devices']:5d}  jax={_ms(row['jax'])} ms  " + "  ".join(parts)
          + f"  load {_load(row)}" + (f"  ({row['jax']['error']})" if "error" in row["jax"] else ""), flush=True)
    if "process_cpu_s" in row["jax"]:
        print("  process CPU s: " + "  ".join(f"{v}={row[v]['process_cpu_s']:.1f}" for v in ["jax", *VARIANTS]
                                              if "process_cpu_s" in row[v]), flush=True)


def markdown(doc: dict) -> str:
    """The results as a Markdown table: times in ms, ratio = spmdsim / jax.pmap."""
    lines = ["| benchmark | N | jax.pmap | jax first call | NumPy front end | ratio | JAX front end, threads | ratio "
             "| JAX front end, vectorized | ratio | vectorized first call | load |", "|---|---:|" + "---:|" * 10]
    for r in doc["rows"]:
        jx = r["jax"]
        lines.append(f"| {_name(r)} | {r['devices']} | {_ms(jx) if 'error' not in jx else 'failed: ' + jx['error'][:60]} "
                     f"| {_first(jx)} | {_ms(r['numpy'])} | {_ratio(r['numpy'], jx)} | {_ms(r['jax-threads'])} "
                     f"| {_ratio(r['jax-threads'], jx)} | {_ms(r['jax-vectorized'])} | {_ratio(r['jax-vectorized'], jx)} "
                     f"| {_first(r['jax-vectorized'])} | {_load(r)} |")
        if "numpy-bound" in r:
            bound = r["numpy-bound"]["median_s"]
            lines.append(f"| (NumPy bound: one add-reduce) | 8 | | | {_ms(r['numpy-bound'])} | "
                         f"{bound / r['numpy']['median_s']:.2f} of the bound | | {bound / r['jax-threads']['median_s']:.2f} "
                         f"of the bound | | {bound / r['jax-vectorized']['median_s']:.2f} of the bound | | |")
            lines.append(f"| (kernel time per call, ms) | 8 | | | {_kernel_ms(r['numpy'])} (bound "
                         f"{_kernel_ms(r['numpy-bound'])}) | | {_kernel_ms(r['jax-threads'])} | | "
                         f"{_kernel_ms(r['jax-vectorized'])} | | | |")
    return "\n".join(lines)


def print_table(rows: list[dict]) -> None:
    header = ["benchmark", "N", "jax.pmap ms", "jax first ms", "numpy ms", "ratio", "jax-threads ms", "ratio",
              "jax-vectorized ms", "ratio", "spmdsim.jax first ms", "load"]
    body = []
    for r in rows:
        body.append([_name(r), str(r["devices"]), _ms(r["jax"]), _first(r["jax"]), _ms(r["numpy"]),
                     _ratio(r["numpy"], r["jax"]), _ms(r["jax-threads"]), _ratio(r["jax-threads"], r["jax"]),
                     _ms(r["jax-vectorized"]), _ratio(r["jax-vectorized"], r["jax"]), _first(r["jax-vectorized"]), _load(r)])
        if "numpy-bound" in r:
            body.append(["  numpy bound", "8", "", "", _ms(r["numpy-bound"]),
                         f"{r['numpy-bound']['median_s'] / r['numpy']['median_s']:.2f} of bound", "", "", "", "", "", ""])
            kernel = f"{_kernel_ms(r['numpy'])} (bound {_kernel_ms(r['numpy-bound'])})"
            body.append(["  kernel ms/call", "8", "", "", kernel, "", _kernel_ms(r["jax-threads"]), "",
                         _kernel_ms(r["jax-vectorized"]), "", "", ""])
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
        for line in [header, *body]:
            print("  ".join(c.rjust(w) for c, w in zip(line, widths)))
        return
    table = Table(title="spmdsim / jax.pmap (medians; ratio < 1: spmdsim is faster)")
    for h in header:
        table.add_column(h, justify="right")
    for b in body:
        table.add_row(*b)
    Console(width=200).print(table)


if __name__ == "__main__":
    sys.exit(main())
