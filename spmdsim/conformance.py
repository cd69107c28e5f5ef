"""``spmdsim conformance [--platform cpu|gpu|tpu] [--report PATH] [pytest options]``: run the conformance suite
against the installed jax and print a matrix: area x passed / failed / expected differences (strict xfails) /
skipped.

Writes ``PATH`` (Markdown, default ``conformance/REPORT.md``) and the same data as JSON beside it
(``REPORT.json``), with the jax version, platform and device count. Other options go to pytest (``-k psum``,
``-x``, ...); such a filtered run writes a report only where ``--report`` says, so that the tracked report
always describes the whole suite. On a machine with GPUs or TPUs,
``--platform gpu`` compares against the accelerators: checks that map over more devices than are present are
skipped, floats compare by size (docs/compare_and_conformance.md, "Against a GPU"). The suite lives
in the source tree (``conformance/``): run the command from a checkout.
"""
from __future__ import annotations

import collections
import datetime
import json
import os
import pathlib
import platform as _platform
import sys

from spmdsim.tools._tables import print_table

OUTCOMES = ("passed", "failed", "expected difference", "skipped")


def find_suite() -> pathlib.Path:
    for base in (pathlib.Path.cwd(), pathlib.Path(__file__).resolve().parent.parent):
        if (base / "conformance" / "harness.py").exists():
            return base / "conformance"
    raise SystemExit("spmdsim conformance: no conformance/ folder here or beside the package; run it from a "
                     "checkout of spmdsim.")


class _Collector:
    """A pytest plugin that counts outcomes per area (a case's area marker, else the test module)."""

    def __init__(self):
        self.areas: dict[str, str] = {}
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.failures: list[str] = []
        self.ulps: dict[str, dict[str, float]] = {}  # primitive -> dtype -> worst ulps against XLA

    def _record_ulps(self, report) -> None:
        """``test_lax_ops.py`` reports ``lax_ulps``: {"primitive|dtype": worst ulp distance measured}."""
        for name, value in getattr(report, "user_properties", ()):
            if name == "lax_ulps":
                for key, distance in value.items():
                    primitive, dtype = key.split("|")
                    per_dtype = self.ulps.setdefault(primitive, {})
                    per_dtype[dtype] = max(per_dtype.get(dtype, 0.0), distance)

    def pytest_collection_modifyitems(self, items):
        for item in items:
            marker = item.get_closest_marker("area")
            module = item.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
            self.areas[item.nodeid] = marker.args[0] if marker else module.replace("_", "-")

    def pytest_runtest_logreport(self, report):
        self._record_ulps(report)
        area = self.areas.get(report.nodeid, "other")
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            if hasattr(report, "wasxfail"):
                outcome = "expected difference" if report.skipped else "failed"
            else:
                outcome = {"passed": "passed", "failed": "failed", "skipped": "skipped"}[report.outcome]
            self.counts[area][outcome] += 1
            if outcome == "failed":
                self.failures.append(report.nodeid)


def _environment(platform: str) -> dict:
    import jax

    import spmdsim
    from spmdsim.jax.numerics import _xla_cpu_isa
    devices = jax.devices()
    return {"spmdsim": spmdsim.__version__, "jax": jax.__version__, "platform": platform,
            "backend": jax.default_backend(), "device_count": len(devices),
            "device_kind": devices[0].device_kind if devices else "", "python": _platform.python_version(),
            "machine": _platform.machine(), "date": datetime.date.today().isoformat(),
            "xla_cpu_isa": str(_xla_cpu_isa.current())}


def _format_ulps(value: float) -> str:
    return "exact" if value == 0 else ("∞" if value == float("inf") else f"{value:.3g}")


def _ulp_section(ulps: dict[str, dict[str, float]]) -> list[str]:
    """The worst ulp distance from XLA:CPU measured per primitive and dtype, by family."""
    if not ulps:
        return []
    try:
        from conformance.lax_records import RECORDS
        families = {r.primitive: r.family for r in RECORDS}
    except ImportError:  # pragma: no cover - the report without the suite's records
        families = {}
    lines = ["", "## Primitives against XLA:CPU: worst distance in ulps", "",
             "From `conformance/test_lax_ops.py` (one op record per primitive, every dtype JAX allows among "
             "bool, int8-int64, uint8-uint64, float16, bfloat16, float32, float64, complex64, complex128; "
             "scalars, empty and non-contiguous arrays, special values, parameter variants). \"exact\": "
             "bit for bit on every value tested (integer and bool results are always compared exactly); "
             "the allowed distances are `TOLERANCE` in `conformance/lax_records.py`.", "",
             "| family | primitive | worst ulps per dtype |", "|---|---|---|"]
    for primitive in sorted(ulps, key=lambda p: (families.get(p, "~"), p)):
        per = ulps[primitive]
        exact = [d for d, u in per.items() if u == 0]
        inexact = [f"{d}: {_format_ulps(u)}" for d, u in sorted(per.items()) if u != 0]
        text = "; ".join(inexact + ([f"exact for {', '.join(sorted(exact))}"] if exact else []))
        lines.append(f"| {families.get(primitive, '')} | `{primitive}` | {text} |")
    return lines


def _markdown(env: dict, rows: list[tuple[str, collections.Counter]], total: collections.Counter,
              failures: list[str], ulps: dict | None = None) -> str:
    lines = [f"# spmdsim conformance against jax {env['jax']} ({env['backend']}, {env['device_count']} devices)", "",
             f"spmdsim {env['spmdsim']} · Python {env['python']} · {env['machine']} · device kind "
             f"`{env['device_kind']}` · {env['date']}", "",
             f"XLA:CPU's instruction set, as spmdsim models it (`spmdsim/jax/numerics/_xla_cpu_isa.py`): "
             f"{env.get('xla_cpu_isa', 'not recorded')}. The ulp bounds below hold under every ISA cap the "
             f"machine supports (`conformance/test_isa.py` reruns the table under each).", "",
             "Each case runs on both spmdsim front ends (NumPy: `spmdsim.pmap` + `spmdsim.lax`; JAX: "
             "`spmdsim.jax.pmap` on the jaxpr, with its thread and its vectorized executor) and on real "
             "`jax.pmap`; results must agree in structure, shape, dtype and value (exact for integers and bools), "
             "and errors in exception class. Expected differences are listed with their reasons in "
             "`conformance/known_differences.py`. The area `vectorized = threads` compares spmdsim's two "
             "executors with each other, bit for bit, on every case (expected differences from JAX included).", "",
             "| area | " + " | ".join(OUTCOMES) + " |", "|---|" + "---:|" * len(OUTCOMES)]
    for area, c in rows + [("**total**", total)]:
        lines.append(f"| {area} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |")
    if failures:
        lines += ["", "## Failures", ""] + [f"- `{f}`" for f in failures]
    lines += _ulp_section(ulps or {})
    return "\n".join(lines) + "\n"


def _print_table(rows, total, env) -> None:
    title = f"spmdsim vs jax {env['jax']} on {env['backend']} ({env['device_count']} devices)"
    body = [[area, *(str(c[o]) for o in OUTCOMES)] for area, c in rows + [("total", total)]]
    print_table(title, ["area", *OUTCOMES], body, right=OUTCOMES, bold_last=True)


def main(argv: list[str] | None = None) -> int:
    """``spmdsim conformance``: returns pytest's exit status.

    Raises:
        UsageError: bad options.
    """
    from spmdsim.cli import ArgumentParser

    parser = ArgumentParser(
        prog="spmdsim conformance", usage="spmdsim conformance [--platform cpu|gpu|tpu] [--report PATH] [pytest "
                                          "options, e.g. -k psum]",
        description="Run the conformance suite (conformance/ in a checkout) against the installed jax.pmap and "
                    "print a matrix: area x passed / failed / expected differences / skipped.",
        epilog="Without pytest options the report goes to conformance/REPORT.md and REPORT.json; a filtered run "
               "(-k, -x, a test path, ...) writes one only with --report.")
    parser.add_argument("--platform", choices=["cpu", "gpu", "tpu"], default="cpu",
                        help="which jax platform to compare against (default cpu, 8 devices)")
    parser.add_argument("--report", metavar="PATH", default=None,
                        help="Markdown report path, JSON beside it (default conformance/REPORT.md for a full run)")
    args, pytest_args = parser.parse_known_args(argv)
    suite = find_suite()
    os.environ["SPMDSIM_CONFORMANCE_PLATFORM"] = args.platform
    if args.platform != "cpu":
        os.environ["JAX_PLATFORMS"] = {"gpu": "cuda", "tpu": "tpu"}[args.platform]
    import pytest

    collector = _Collector()
    sys.path.insert(0, str(suite.parent))
    code = pytest.main([str(suite), "-q", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
                        "--rootdir", str(suite.parent),
                        *pytest_args], plugins=[collector])
    env = _environment(args.platform)
    rows = sorted(collector.counts.items())
    total = sum((c for _, c in rows), collections.Counter())
    _print_table(rows, total, env)
    if pytest_args and not args.report:
        print(f"filtered run ({' '.join(pytest_args)}): {suite / 'REPORT.md'} left as it was; give --report PATH to "
              f"write this run's report.")
        return int(code)
    report = pathlib.Path(args.report) if args.report else suite / "REPORT.md"
    report.write_text(_markdown(env, rows, total, collector.failures, collector.ulps))
    report.with_suffix(".json").write_text(json.dumps(
        {"environment": env, "areas": {a: {o: c[o] for o in OUTCOMES} for a, c in rows},
         "total": {o: total[o] for o in OUTCOMES}, "failures": collector.failures,
         "lax_worst_ulps": {p: {d: (u if u != float("inf") else "inf") for d, u in sorted(per.items())}
                            for p, per in sorted(collector.ulps.items())}}, indent=2) + "\n")
    print(f"report: {report} and {report.with_suffix('.json')}")
    return int(code)
