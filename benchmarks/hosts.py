"""``python -m benchmarks.hosts [--repeats R] [--out FILE]``: multi-host spmdsim beside real multi-process JAX.

1. psum latency at 8 devices as 1, 2 and 4 hosts: ``spmdsim run --devices 8 --hosts H`` (MPI processes; the
   threads and the vectorized executors) and real JAX as H processes of 8/H CPU devices
   (``jax.distributed.initialize``, gloo collectives on loopback), the same script (``_host_psum.py``).
2. Peak memory per process of a psum over 16,384 devices with the vectorized executor (64 KiB per device, 1 GiB
   in all), as one process and as 4 hosts (``_host_memory.py``).

Needs the ``mpi`` extra (``pip install "spmdsim[mpi]"``). Times are medians per call in ms.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

from benchmarks.__main__ import machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PSUM = os.path.join(ROOT, "benchmarks", "_host_psum.py")
MEMORY = os.path.join(ROOT, "benchmarks", "_host_memory.py")
ENV = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
TIMEOUT = 600


def _last_json(proc: subprocess.CompletedProcess) -> dict:
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "Error" in ln]
        return {"error": (lines[-1] if lines else f"exit {proc.returncode}")[:300]}
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])


def spmdsim_psum(hosts: int, executor: str, repeats: int) -> dict:
    command = [sys.executable, "-m", "spmdsim", "run", "--devices", "8", "--hosts", str(hosts), "--executor",
               executor, PSUM]
    return _last_json(subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT,
                                     env={**ENV, "REPEATS": str(repeats)}))


def jax_psum(processes: int, repeats: int) -> dict:
    env = {**ENV, "JAX_LOCAL_DEVICES": str(8 // processes), "REPEATS": str(repeats)}
    if processes > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env.update(JAX_COORDINATOR=f"127.0.0.1:{s.getsockname()[1]}", JAX_NUM_PROCESSES=str(processes))
    procs = [subprocess.Popen([sys.executable, PSUM], env={**env, "JAX_PROCESS_ID": str(p)}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for p in range(processes)]
    try:
        outs = [(*p.communicate(timeout=TIMEOUT), p.returncode) for p in procs]
    finally:
        for p in procs:
            p.kill()
    out, err, code = outs[0]
    return _last_json(subprocess.CompletedProcess([], code, out, err))


def memory(hosts: int, devices: int, block: int) -> dict:
    command = [sys.executable, MEMORY, str(devices), str(block)]
    if hosts > 1:
        from spmdsim.tools._launch import mpiexec_path
        command = [mpiexec_path(), "-n", str(hosts), *command]
    return _last_json(subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=ENV))


def _ms(r: dict) -> str:
    return "—" if "error" in r else f"{1e3 * r['median_s']:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--devices", type=int, default=16384, help="devices of the memory benchmark")
    parser.add_argument("--block", type=int, default=16384, help="float32 per device in the memory benchmark")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "hosts_results.json"))
    args = parser.parse_args(argv)
    rows = []
    print("psum of float32[4] per device, 8 devices (median ms per call)")
    print(f"{'hosts':>5}  {'real JAX (gloo)':>15}  {'spmdsim threads':>15}  {'ratio':>5}  {'spmdsim vectorized':>18}  "
          f"{'ratio':>5}")
    for hosts in (1, 2, 4):
        row = {"hosts": hosts, "jax": jax_psum(hosts, args.repeats),
               "threads": spmdsim_psum(hosts, "threads", args.repeats),
               "vectorized": spmdsim_psum(hosts, "vectorized", args.repeats)}
        rows.append(row)
        ratio = {k: "—" if "error" in row[k] or "error" in row["jax"] else
                 f"{row[k]['median_s'] / row['jax']['median_s']:.2f}" for k in ("threads", "vectorized")}
        print(f"{hosts:>5}  {_ms(row['jax']):>15}  {_ms(row['threads']):>15}  {ratio['threads']:>5}  "
              f"{_ms(row['vectorized']):>18}  {ratio['vectorized']:>5}", flush=True)
        for k in ("jax", "threads", "vectorized"):
            if "error" in row[k]:
                print(f"       {k}: {row[k]['error']}")
    one, four = memory(1, args.devices, args.block), memory(4, args.devices, args.block)
    print(f"\npeak memory per process, psum over {args.devices} devices x {args.block} float32 "
          f"({args.devices * args.block * 4 / 2**30:.2f} GiB), vectorized executor")
    if "error" in one or "error" in four:
        print(f"  failed: {one.get('error') or four.get('error')}")
    else:
        base, hosts = one["per_host"][0], four["per_host"]
        worst = max(hosts, key=lambda h: h["peak_mib"])
        print(f"  one process: peak {base['peak_mib']:.0f} MiB (before the call {base['before_mib']:.0f}), "
              f"{base['seconds']:.2f} s")
        print(f"  4 hosts:     peak {worst['peak_mib']:.0f} MiB per process (before {worst['before_mib']:.0f}), "
              f"{max(h['seconds'] for h in hosts):.2f} s")
        print(f"  ratio of peaks {worst['peak_mib'] / base['peak_mib']:.2f}; of what the call added "
              f"{(worst['peak_mib'] - worst['before_mib']) / (base['peak_mib'] - base['before_mib']):.2f}; "
              f"same result: {abs(sum(h['checksum'] for h in hosts) - base['checksum']) == 0}")
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "psum": rows, "memory": {"one": one, "four": four}}, f, indent=1)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
