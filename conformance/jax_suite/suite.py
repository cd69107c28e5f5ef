"""JAX's own test files, run on JAX and on spmdsim, compared test by test (issue 25's measurement).

``python -m conformance.jax_suite`` (see ``--help`` and this folder's README.md):

1. extracts ``tests/<file>`` of JAX's repository at the installed jax's tag (``jax-v`` + ``jax.__version__``)
   from the mirror into a work folder, with JAX's root ``conftest.py`` and ``pyproject.toml`` (its pytest
   settings: ``filterwarnings = error``, ``--import-mode=importlib``) and any ``tests/`` module a file imports;
   everything else the files import (``jax._src.test_util`` and ``internal_test_util``) is the installed jax's.
   JAX's test defaults are left as they are: ``jtu.JaxTestCase.setUp`` turns on ``jax_enable_checks`` (and
   strict dtype/rank promotion, ``jax_legacy_prng_key='error'``) for every test;
2. runs each file with pytest in a subprocess, once on JAX and once per spmdsim executor with
   :func:`spmdsim.jax.integration._patch.patched_jax` entered for the whole session by ``plugin.py`` (before the test
   modules are imported, so ``from jax import pmap`` in ``pmap_test.py`` gets spmdsim's pmap, as under
   ``spmdsim run``; ``shard_map_test.py``'s ``from jax._src.shard_map import shard_map`` reaches spmdsim
   because the patch replaces ``jax._src.shard_map._shard_map``, which that function calls);
3. compares: of the tests that pass on JAX, how many pass / fail / error / time out on spmdsim, the failures
   grouped by their first error line, those that are about lowering, compiled text, cost analysis or compile
   counting set apart as out of scope; writes REPORT.md and OUTCOMES.json here and prints a summary.

The JAX run's outcomes are kept (``results/``) and reused while the jax version and the test selection are
the same (``--rerun-jax`` to redo them). A run killed half-way resumes with ``--resume``.
"""
from __future__ import annotations

import argparse
import ast
import collections
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MIRROR = "/work/.mirror/jax-ml+jax/repo"
DEFAULT_FILES = ["pmap_test.py", "shard_map_test.py"]
# --ops: JAX's op test files (those of issue 26 present at the tag), each function under test traced by JAX and
# its jaxpr evaluated by spmdsim on one virtual device (plugin.route_execution)
OP_FILES = ["lax_test.py", "lax_numpy_test.py", "lax_numpy_einsum_test.py", "lax_numpy_indexing_test.py",
            "lax_numpy_operators_test.py", "lax_numpy_reducers_test.py", "lax_numpy_setops_test.py",
            "lax_numpy_ufuncs_test.py", "lax_numpy_vectorize_test.py", "linalg_test.py", "fft_test.py",
            "lax_scipy_test.py", "lax_scipy_special_functions_test.py", "random_lax_test.py",
            "lax_control_flow_test.py"]
PASSING = {"passed"}
NOT_PASSING = ("failed", "error", "timeout", "crashed", "not run")


# --------------------------------------------------------------------------------------------- extraction

def jax_version() -> str:
    out = subprocess.run([sys.executable, "-c", "import jax; print(jax.__version__)"], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def _git_show(mirror: str, tag: str, path: str) -> str | None:
    proc = subprocess.run(["git", "-C", mirror, "show", f"{tag}:{path}"], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


def extract(mirror: str, tag: str, files: list[str], workdir: str) -> list[str]:
    """Writes the test files (and what they need from JAX's repository) under ``workdir``; returns what was
    extracted, as repository paths."""
    if subprocess.run(["git", "-C", mirror, "rev-parse", "--verify", "-q", f"{tag}^{{commit}}"],
                      capture_output=True).returncode:
        sys.exit(f"jax_suite: no tag {tag} in {mirror} (the installed jax's tests are taken from its tag).")
    if os.path.isdir(workdir):
        shutil.rmtree(workdir)
    os.makedirs(os.path.join(workdir, "tests"))
    wanted = ["conftest.py", "pyproject.toml"] + [f"tests/{f}" for f in files]
    done = []
    while wanted:
        path = wanted.pop(0)
        if path in done:
            continue
        text = _git_show(mirror, tag, path)
        if text is None:
            if path.startswith("tests/") and path[len("tests/"):] in files:
                sys.exit(f"jax_suite: no {path} in JAX's repository at {tag}.")
            continue
        with open(os.path.join(workdir, path), "w") as f:
            f.write(text)
        done.append(path)
        if path.startswith("tests/"):  # a test module importing a sibling (e.g. `import foo_util`)
            for name in _top_level_imports(text):
                wanted.append(f"tests/{name}.py")
    shutil.copy(os.path.join(HERE, "plugin.py"), os.path.join(workdir, "jax_suite_plugin.py"))
    return done


def _top_level_imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"jax", "jaxlib", "numpy", "absl", "scipy", "ml_dtypes"}


# ------------------------------------------------------------------------------------------------- scope

# What puts a test out of issue 25's scope, found in its method's code (comments aside): lowering, compiled
# text, cost analysis, compile (and trace-cache) counting. spmdsim replaces the execution, not XLA's compiler.
OUT_OF_SCOPE = [
    ("lowering", re.compile(r"\.lower\(")),
    ("compile", re.compile(r"\.compile\(|runtime_executable")),
    ("compiled text", re.compile(r"\bas_text\(|compiler_ir\(")),
    ("cost analysis", re.compile(r"cost_analysis|memory_analysis")),
    ("compile counting", re.compile(r"\bcount_[a-z_]*(compil|lowering|cache_miss)[a-z_]*|"
                                    r"assert_num_jit_and_pmap_compilations|_cache_size\(|cache_info\(")),
]
# ... or in its name.
OUT_OF_SCOPE_NAME = re.compile(r"lower|compile|hlo|cost_analysis|memory_analysis", re.IGNORECASE)


def _code(lines: list[str]) -> str:
    """The tokens of ``lines`` without comments, joined without spaces (``f(x).lower(y)`` whatever the
    layout)."""
    import io
    import textwrap
    import tokenize

    try:
        tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent("".join(lines))).readline)
        return "".join(t.string for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                                                    tokenize.INDENT, tokenize.DEDENT))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return "".join(lines)


def scope_classifier(path: str):
    """A function of a node id (``tests/f.py::Class::test_name3``) giving the out-of-scope kinds of that test
    ([] when in scope), from the code of its method in ``path``: the method of its class (or of a base class
    in the file) whose name is the longest prefix of the test's name (absl's parameterized names add a
    suffix)."""
    source = open(path).read()
    lines = source.splitlines(keepends=True)
    classes = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            methods = {f.name: _code(lines[f.lineno - 1:f.end_lineno]) for f in node.body
                       if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            classes[node.name] = (methods, [b.id for b in node.bases if isinstance(b, ast.Name)])

    def methods_of(cls: str, seen=()) -> dict:
        own, bases = classes.get(cls, ({}, []))
        found = {}
        for base in bases:
            if base not in seen:
                found.update(methods_of(base, seen + (cls,)))
        return {**found, **own}

    def kinds(nodeid: str) -> list[str]:
        parts = nodeid.split("::")
        name = parts[-1].split("[")[0]
        methods = methods_of(parts[-2]) if len(parts) > 2 else {}
        prefixes = [m for m in methods if name.startswith(m)]
        code = methods[max(prefixes, key=len)] if prefixes else ""
        found = [kind for kind, pattern in OUT_OF_SCOPE if pattern.search(code)]
        if not found and OUT_OF_SCOPE_NAME.search(name):
            found.append(f"name ({OUT_OF_SCOPE_NAME.search(name).group(0)})")
        return found

    return kinds


# ------------------------------------------------------------------------------------------------ running

def read_records(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut off by a kill
                pass
    return records


def outcomes(records: list[dict]) -> dict[str, dict]:
    """Per node id: outcome (passed, failed, error, skipped, xfailed, xpassed, timeout, crashed, not run),
    message lines, the innermost frame, spmdsim's innermost frame, the test's frame, duration."""
    tests: dict[str, dict] = {}
    for r in records:
        t = tests.setdefault(r["nodeid"], {"reports": {}, "started": False, "finished": False})
        if r["event"] == "start":
            t["started"] = True
        elif r["event"] == "finish":
            t["finished"] = True
        elif r["event"] == "report":
            t["reports"][r["when"]] = r
        elif r["event"] in ("timeout", "crashed"):
            t["killed"] = r
    result = {}
    for nodeid, t in tests.items():
        reps = t["reports"]
        call, setup, teardown = reps.get("call"), reps.get("setup"), reps.get("teardown")
        info = {"message": [], "frame": None, "spmdsim_frame": None,
                "test_frame": None,
                "duration": round(sum(r.get("duration", 0) for r in reps.values()), 3)}
        bad = next((r for r in (call, setup, teardown) if r and r["outcome"] == "failed"), None)
        if "killed" in t:
            outcome = t["killed"]["event"]
            info["message"] = t["killed"].get("message", [])
        elif call and call["outcome"] == "failed":
            outcome = "failed"
        elif bad is not None:
            outcome = "error"
        elif any(r["outcome"] == "skipped" for r in (setup, call) if r):
            skipped = next(r for r in (setup, call) if r and r["outcome"] == "skipped")
            outcome = "xfailed" if skipped.get("xfail") else "skipped"
            info["message"] = skipped.get("message", [])
        elif call and call["outcome"] == "passed":
            outcome = "xpassed" if call.get("xfail") else "passed"
        else:
            outcome = "not run"
        if bad is not None and "killed" not in t:
            info.update({k: bad.get(k) for k in ("frame", "spmdsim_frame", "test_frame")},
                        message=bad.get("message", []))
        info["outcome"] = outcome
        result[nodeid] = info
    return result


def _label(mode: str, config: dict | None, kind: str = "maps") -> str:
    """``mode``, with the JAX options a diagnostic run overrides (``threads+jax_enable_checks=False``); an op
    run's (``--ops``) starts with ``ops-``."""
    return "+".join([mode if kind == "maps" else f"{kind}-{mode}",
                     *(f"{k}={v}" for k, v in sorted((config or {}).items()))])


def run_file(file: str, mode: str, *, workdir: str, results: str, keyword: str | None, nodeids: list[str],
             test_timeout: float, wall_timeout: float, resume: bool, stream: bool, config: dict | None = None,
             kind: str = "maps") -> dict:
    """Runs ``tests/<file>`` under ``mode`` (``jax`` or an executor) until every selected test has an outcome
    (a hung or crashed test is recorded and the rest run in a new process) or ``wall_timeout`` passes.
    Returns {"records": path, "seconds": wall time, "attempts": n, "complete": bool}."""
    stem = f"{file.removesuffix('.py')}.{_label(mode, config, kind)}"
    records = os.path.join(results, f"{stem}.jsonl")
    deselect = os.path.join(results, f"{stem}.deselect")
    hang = os.path.join(results, f"{stem}.hang.txt")
    log = os.path.join(results, f"{stem}.log")
    if not resume:  # a fresh run: this file's and mode's records, logs, junit files and stack dumps go
        for name in os.listdir(results):
            if name.startswith(stem + "."):
                os.remove(os.path.join(results, name))
    env = dict(os.environ, SPMDSIM_JAX_SUITE_MODE=mode, SPMDSIM_JAX_SUITE_KIND=kind, SPMDSIM_JAX_SUITE_RECORDS=records,
               SPMDSIM_JAX_SUITE_CONFIG=json.dumps(config or {}),
               SPMDSIM_JAX_SUITE_DESELECT=deselect, SPMDSIM_JAX_SUITE_TEST_TIMEOUT=str(test_timeout),
               SPMDSIM_JAX_SUITE_HANG=hang, JAX_PLATFORMS="cpu",
               SPMDSIM_JAX_SUITE_REPO=REPO, SPMDSIM_TRACEBACK_FILTERING="off",  # spmdsim's frames in the records (JaxTestCase: JAX's too)
               PYTHONPATH=os.pathsep.join(p for p in (workdir, os.environ.get("PYTHONPATH")) if p))
    targets = [f"tests/{n}" for n in nodeids] if nodeids else [f"tests/{file}"]
    start, attempts, complete = time.monotonic(), 0, False
    while True:
        attempts += 1
        done = {nid for nid, t in outcomes(read_records(records)).items() if t["outcome"] != "not run"}
        with open(deselect, "w") as f:
            f.write("".join(n + "\n" for n in sorted(done)))
        cmd = [sys.executable, "-m", "pytest", *targets, "-p", "jax_suite_plugin", "-p", "no:spmdsim",
               "-p", "no:cacheprovider", "-q", "--tb=short", "-rN",
               f"--junitxml={os.path.join(results, f'{stem}.{attempts}.xml')}"]
        if keyword:
            cmd += ["-k", keyword]
        left = wall_timeout - (time.monotonic() - start)
        if left <= 0:
            break
        with open(log, "a") as out:
            out.write(f"\n===== attempt {attempts}: {' '.join(cmd)}\n")
            out.flush()
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, start_new_session=True,
                                    stdout=None if stream else out, stderr=subprocess.STDOUT)
            try:
                rc = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                out.write(f"\n===== killed after the wall-clock limit ({wall_timeout:.0f} s)\n")
                break
        tests = outcomes(read_records(records))
        hung = [nid for nid, t in tests.items() if t["outcome"] == "not run" and
                any(r["event"] == "start" and r["nodeid"] == nid for r in read_records(records))]
        if not hung:
            complete = rc in (0, 1, 5)  # all ran / some failed / none selected
            if not complete:
                with open(log, "a") as out:
                    out.write(f"\n===== pytest exited with status {rc}: see above\n")
            break
        dump = open(hang).read() if os.path.exists(hang) else ""
        for nid in hung:
            kind = "timeout" if "Timeout (" in dump else "crashed"
            message = [f"timed out after {test_timeout:.0f} s (harness limit)"] if kind == "timeout" else \
                [f"the test process exited with status {rc} during this test"]
            with open(records, "a") as f:
                f.write(json.dumps({"event": kind, "nodeid": nid, "message": message}) + "\n")
            if kind == "timeout":
                with open(os.path.join(results, f"{stem}.hang.{len(done)}.txt"), "w") as f:
                    f.write(dump)
    return {"records": records, "seconds": round(time.monotonic() - start, 1), "attempts": attempts,
            "complete": complete}


# ---------------------------------------------------------------------------------------------- reporting

def cause_key(message: list[str]) -> str:
    """The first error line (with the next line when the first is only an exception name), addresses and
    numbers blurred so that failures differing only in a shape or a count group together."""
    if not message:
        return "(no message)"
    line = message[0]
    if re.fullmatch(r"[\w.]+(: *)?", line.strip()) and len(message) > 1:
        line = f"{line.rstrip(': ')}: {message[1].strip()}"
    line = re.sub(r"0x[0-9a-fA-F]+", "<address>", line)
    line = re.sub(r"\d+", "#", line)
    return line[:160]


def short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


def compare(jax_tests: dict, sim_tests: dict, out_of_scope) -> dict:
    """Of the tests that pass on JAX, the outcome on spmdsim, split in and out of scope (``out_of_scope``: node
    id -> the kinds that put it out, see :func:`scope_classifier`)."""
    rows = {"in": collections.Counter(), "out": collections.Counter()}
    failing = {"in": [], "out": []}
    for nid, t in jax_tests.items():
        if t["outcome"] != "passed":
            continue
        sim = sim_tests.get(nid, {"outcome": "not run", "message": ["not collected on spmdsim"]})
        kinds = out_of_scope(nid)
        scope = "out" if kinds else "in"
        rows[scope][sim["outcome"]] += 1
        if sim["outcome"] not in PASSING:
            failing[scope].append((nid, sim, kinds))
    extra = sorted(nid for nid, s in sim_tests.items() if s["outcome"] == "passed" and
                   jax_tests.get(nid, {}).get("outcome") != "passed")
    return {"rows": rows, "failing": failing, "passes_only_on_spmdsim": extra,
            "jax_outcomes": collections.Counter(t["outcome"] for t in jax_tests.values())}


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "–"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def causes(failing: list) -> list[tuple[str, list]]:
    groups = collections.defaultdict(list)
    for nid, sim, _ in failing:
        groups[cause_key(sim["message"]) if sim["outcome"] not in ("timeout", "crashed", "not run")
               else f"({sim['outcome']}) {cause_key(sim['message'])}"].append((nid, sim))
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _most_common(tests: list, key: str) -> str:
    counts = collections.Counter(sim.get(key) for _, sim in tests if sim.get(key))
    return counts.most_common(1)[0][0] if counts else "–"


def by_place(failing: list) -> list[tuple[tuple, list]]:
    groups = collections.defaultdict(list)
    for nid, sim, _ in failing:
        kind = sim["message"][0].split(":")[0].strip() if sim["message"] and sim["outcome"] in ("failed", "error") \
            else sim["outcome"]
        groups[(kind, sim.get("frame"), sim.get("spmdsim_frame"))].append((nid, sim))
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), str(kv[0])))


def summary_lines(file: str, executor: str, c: dict) -> list[str]:
    lines = []
    for scope, title in (("in", "in scope"), ("out", "out of scope")):
        row = c["rows"][scope]
        total = sum(row.values())
        bad = sum(row[k] for k in NOT_PASSING)
        lines.append(f"{file} [{executor}] {title}: {total} pass on JAX; on spmdsim {row['passed']} pass, "
                     f"{row['failed']} fail, {row['error']} error, {row['timeout']} timeout, "
                     f"{row['crashed'] + row['not run']} not run/crashed, {row['skipped']} skipped "
                     f"-> {bad} not passing ({_pct(bad, total)})")
    return lines


# The op mode's failures explained: (pattern on the test's id or its first error line, cause). The first match
# names a failure's cause in REPORT_OPS.md; what matches none is listed as "not yet explained".
OP_CAUSES = [
    (r"CustomElementTypesTest|Cannot interpret 'foo'",
     "extended dtypes other than PRNG keys (lax_test's custom element type `foo`, a physical representation by "
     "`dtype._rules`): spmdsim's JAX front end knows the physical form of keys only (spmdsim/jax/evaluation/_dtypes.py)"),
    (r"primitive 'composite'",
     "no rule for `composite` (`lax.composite`): its value is its decomposition `jaxpr` "
     "(`ex.eval_closed(jaxpr, args)` in spmdsim/jax/rules/_control_flow.py, as for `closed_call`)"),
    (r"primitive 'call_exported'",
     "no rule for `call_exported` (`jax.export`'s serialized StableHLO: spmdsim evaluates jaxprs, not StableHLO)"),
    (r"QrInvalidDtype|Unsupported dtype float16",
     "a LAPACK-backed primitive of float16: XLA:CPU's lowering rejects it (NotImplementedError 'Unsupported dtype "
     "float16'), spmdsim computes it in float32 (spmdsim/jax/rules/_linalg.py's _compute_dtype)"),
    (r"perturb_singular",
     "`tridiagonal_solve(perturb_singular=True)`: jaxlib's own kernel (ported in spmdsim/jax/rules/_linalg.py)"),
    (r"DebugInfs|DebugNans|FloatingPointError not raised",
     "`jax_debug_infs`/`jax_debug_nans`: XLA's executable checks its results (plugin.route_execution does too)"),
    (r"RandomOutShardingTest|should match the aval mesh|Mesh for all inputs should be equal",
     "harness: an eager result under an explicit mesh typed with Auto mesh axes (`random.bits(..., out_sharding=s)`"
     " inside `jax.set_mesh`; 5 of 6 such tests fixed by placing results without dispatching a conversion)"),
    (r"testBernoulliSmallProbabilty",
     "time: 2 x 10^8 threefry samples in NumPy take longer than the op harness's 120 s per test on the loaded "
     "2-core machine (JAX: 39 s); with a longer limit it passes"),
    (r"testScanGrad_.*unroll0",
     "numerics: `check_grads`' second-order finite differences in float32 (eps 1e-3) are noise-level; a few-ulp "
     "difference in `sin` moves the estimate past rtol 0.5 (the first-order comparison and the other 15 scan "
     "variants pass; JAX passes under every ISA cap)"),
    (r"testArrayCopy|testArrayExplicitDtypes",
     "harness: a result aliasing its operand's buffer (`jit(jnp.asarray)`), int64 under "
     "`explicit_x64_dtypes('allow')` canonicalised (plugin.route_execution copies and keeps them)"),
]


def op_cause(nid: str, sim: dict) -> str:
    text = f"{nid} {' '.join(sim.get('message', [])[:2])}"
    return next((cause for pattern, cause in OP_CAUSES if re.search(pattern, text)), "not yet explained")


def op_causes_section(per_file: dict) -> list[str]:
    """The in-scope failures of every file, by cause (OP_CAUSES), per executor."""
    executors = sorted({e for _, e in per_file})
    counts, examples = collections.defaultdict(collections.Counter), collections.defaultdict(list)
    for (file, executor), d in per_file.items():
        for nid, sim, _ in d["compare"]["failing"]["in"]:
            cause = op_cause(nid, sim)
            counts[cause][executor] += 1
            if len(examples[cause]) < 3 and short(nid) not in examples[cause]:
                examples[cause].append(short(nid))
    out = ["## Figures", "", "Of the tests that pass on JAX, how many pass on spmdsim (every test, in scope or not; the "
           "out-of-scope ones are lowering/compile tests, whose compiled executables run on XLA in both runs).", "",
           "| file | executor | pass on JAX | pass on spmdsim | % |", "|---|---|---:|---:|---:|"]
    totals = collections.defaultdict(lambda: [0, 0])
    for (file, executor), d in per_file.items():
        rows = d["compare"]["rows"]
        jax_pass = sum(rows["in"].values()) + sum(rows["out"].values())
        sim_pass = rows["in"]["passed"] + rows["out"]["passed"]
        totals[executor][0] += jax_pass
        totals[executor][1] += sim_pass
        out.append(f"| {file} | {executor} | {jax_pass} | {sim_pass} | {_pct(sim_pass, jax_pass)} |")
    for executor, (jax_pass, sim_pass) in totals.items():
        out.append(f"| **all files** | {executor} | **{jax_pass}** | **{sim_pass}** | **{_pct(sim_pass, jax_pass)}** |")
    out += ["", "## Failures by cause", "", "The in-scope tests that pass on JAX and not on spmdsim, over all files, by what "
           "makes them fail (`suite.OP_CAUSES`).", "",
           f"| cause | {' | '.join(executors)} | examples |", f"|---|{'---:|' * len(executors)}---|"]
    for cause in sorted(counts, key=lambda c: -sum(counts[c].values())):
        out.append(f"| {cause} | {' | '.join(str(counts[cause][e]) for e in executors)} | "
                   f"{', '.join(f'`{_md(x)}`' for x in examples[cause])} |")
    return out + [""]


def write_report(path: str, meta: dict, per_file: dict, changes: list[str]) -> None:
    out = [f"# JAX's own tests on spmdsim ({', '.join(meta['files'])})", "",
           "Generated by `python -m conformance.jax_suite` (conformance/jax_suite/README.md). Do not edit by hand.",
           "", f"- jax {meta['jax']}, its tests from tag `{meta['tag']}` of {meta['mirror']}",
           f"- executors: {', '.join(meta['executors'])}; " + (
               "8 CPU devices" if meta.get("kind", "maps") == "maps" else
               "every jitted program and eagerly applied primitive traced by JAX, its jaxpr evaluated by spmdsim "
               "on one virtual device (`plugin.route_execution`)") +
           "; JAX's test defaults (`jax_enable_checks`, strict promotion, `filterwarnings = error`)",
           *([f"- `JAX_NUM_GENERATED_CASES={meta['generated_cases']}` (JAX's default: 10)"]
             if meta.get("generated_cases") else []),
           *([f"- XLA:CPU model (spmdsim/jax/numerics/_xla_cpu_isa.py): {meta['isa']}"] if meta.get("isa") else []),
           f"- report written {meta['date']}; machine: {meta['cores']} cores ({meta['machine']}), shared with other "
           f"work (the load average at each run's start is below); per-test limit {meta['test_timeout']:.0f} s", "",
           "| file | run | date | spmdsim at | load at start | wall time (s) | processes | complete |",
           "|---|---|---|---|---|---:|---:|---|"]
    seen = set()
    for (file, executor), d in per_file.items():
        for mode, r in (("jax", d["jax_run"]), (executor, d["sim_run"])):
            if (file, mode) not in seen:
                seen.add((file, mode))
                out.append(f"| {file} | {mode} | {r.get('date', '?')} | {r.get('commit', '?') if mode != 'jax' else '–'} "
                           f"| {r.get('load', '?')} | {r['seconds']} | {r['attempts']} | {'yes' if r['complete'] else 'NO'} |")
    out.append("")
    if meta.get("config"):
        out += [f"- **diagnostic run, not the measurement**: on spmdsim JAX's test defaults were overridden with "
                f"{', '.join(f'`{k}={v!r}`' for k, v in meta['config'].items())} (the JAX run keeps them)", ""]
    if meta.get("keyword"):
        out += [f"- selection: `-k {meta['keyword']}`", ""]
    if meta.get("nodeids"):
        out += [f"- selection: {len(meta['nodeids'])} named tests", ""]
    out += ["## Summary", "",
            "Of the tests that pass on JAX, how they end on spmdsim. *Not passing* = fail + error + timeout + "
            "crash/not run; the percentage is of the tests passing on JAX in that row.", "",
            "| file | executor | scope | pass on JAX | pass | fail | error | timeout | crash / not run | skipped "
            "| not passing | % |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (file, executor), d in per_file.items():
        for scope in ("in", "out"):
            row = d["compare"]["rows"][scope]
            total, bad = sum(row.values()), sum(row[k] for k in NOT_PASSING)
            out.append(f"| {file} | {executor} | {scope} | {total} | {row['passed']} | {row['failed']} | "
                       f"{row['error']} | {row['timeout']} | {row['crashed'] + row['not run']} | {row['skipped']} | "
                       f"{bad} | **{_pct(bad, total)}** |")
    out.append("")
    for (file, executor), d in per_file.items():
        jo = d["compare"]["jax_outcomes"]
        out.append(f"- {file} [{executor}]: on JAX {', '.join(f'{v} {k}' for k, v in sorted(jo.items()))}"
                   f"{'' if d['jax_run']['complete'] else ' (JAX run incomplete)'}"
                   f"{'' if d['sim_run']['complete'] else f' ({executor} run incomplete: see results/)'}; "
                   f"{len(d['compare']['passes_only_on_spmdsim'])} pass on spmdsim but not on JAX")
    out.append("")
    if meta.get("kind") == "ops":
        out += op_causes_section(per_file)
    if changes:
        out += ["## Changes since the previous report", "", *[f"- {c}" for c in changes[:200]], ""]
        if len(changes) > 200:
            out += [f"- … and {len(changes) - 200} more", ""]
    for (file, executor), d in per_file.items():
        failing = d["compare"]["failing"]
        out += [f"## {file}, {executor}: in-scope failures by cause", "",
                "| # | first error line (numbers blurred) | raised at (most common) | innermost spmdsim frame (most "
                "common) | example test |", "|---:|---|---|---|---|"]
        for key, tests in causes(failing["in"]):
            out.append(f"| {len(tests)} | `{_md(key)}` | {_md(_most_common(tests, 'frame'))} | "
                       f"{_md(_most_common(tests, 'spmdsim_frame'))} | `{_md(short(tests[0][0]))}` |")
        out += ["", f"The same failures by where the error was raised (exception type, innermost frame, innermost "
                "spmdsim frame):", "", "| # | exception | raised at | innermost spmdsim frame | example test |",
                "|---:|---|---|---|---|"]
        for (kind, frame, sframe), tests in by_place(failing["in"]):
            out.append(f"| {len(tests)} | {_md(kind)} | {_md(frame or '–')} | {_md(sframe or '–')} | "
                       f"`{_md(short(tests[0][0]))}` |")
        out += ["", "<details><summary>every in-scope failure</summary>", "",
                "| test | outcome | first error line | raised at | spmdsim frame | test frame |",
                "|---|---|---|---|---|---|"]
        for nid, sim, _ in sorted(failing["in"]):
            msg = " / ".join(sim["message"][:2])[:160]
            out.append(f"| `{_md(short(nid))}` | {sim['outcome']} | {_md(msg)} | {_md(sim.get('frame') or '')} | "
                       f"{_md(sim.get('spmdsim_frame') or '')} | {_md(sim.get('test_frame') or '')} |")
        out += ["", "</details>", "", f"### {file}, {executor}: out-of-scope tests not passing", "",
                "Out of scope: the test's source uses `.lower()`, `.compile()`, compiled text (`as_text`, "
                "`compiler_ir`), cost/memory analysis or compile/cache-miss counting (or its name says "
                "lower/compile/hlo).", "",
                "| test | why out of scope | outcome | first error line |", "|---|---|---|---|"]
        for nid, sim, kinds in sorted(failing["out"]):
            msg = " / ".join(sim["message"][:2])[:200]
            out.append(f"| `{_md(short(nid))}` | {', '.join(kinds)} | {sim['outcome']} | {_md(msg)} |")
        out.append("")
    if meta.get("kind") == "ops":
        cases = f" --generated-cases {meta['generated_cases']}" if meta.get("generated_cases") else ""
        commands = [f"python -m conformance.jax_suite --ops --executor threads vectorized{cases}",
                    f"python -m conformance.jax_suite --ops --files lax_test.py -k 'testOp'{cases}",
                    "python -m conformance.jax_suite --ops --files 'fft_test.py::FftTest::testFftEmpty' --stream "
                    "--no-report   # one test, traceback shown",
                    f"python -m conformance.jax_suite --ops --report-only --executor threads vectorized{cases}"]
    else:
        commands = ["python -m conformance.jax_suite                       # both files, threads executor",
                    "python -m conformance.jax_suite --executor threads vectorized",
                    "python -m conformance.jax_suite --files pmap_test.py -k 'testPsum'",
                    "python -m conformance.jax_suite --files 'pmap_test.py::PythonPmapTest::testBasic' --stream "
                    "--no-report   # one test, traceback shown",
                    "python -m conformance.jax_suite --report-only         # this report again from results/"]
    out += ["## Re-running", "", "```", ". .venv/bin/activate", *commands, "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


# ------------------------------------------------------------------------------------------------- main

def _git_commit() -> str:
    proc = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no", "spmdsim"],
                           capture_output=True, text=True).stdout.strip()
    return proc.stdout.strip() + (" (spmdsim/ modified)" if dirty else "")


def _isa() -> str:
    """The XLA:CPU model spmdsim's JAX front end follows in the runs (this CPU under XLA_FLAGS' cap, or
    SPMDSIM_XLA_CPU_ISA): what spmdsim/jax/numerics/_xla_cpu_isa.py reads in a fresh process with this environment."""
    proc = subprocess.run([sys.executable, "-c", "from spmdsim.jax.numerics import _xla_cpu_isa as m; print(m.current())"],
                          capture_output=True, text=True, cwd=REPO)
    return proc.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.jax_suite", description=__doc__.split("\n\n")[0])
    ap.add_argument("--executor", nargs="+", default=["threads"], choices=["threads", "vectorized"])
    ap.add_argument("--files", nargs="+", default=None,
                    help=f"files of JAX's tests/ (or node ids FILE::Class::test); default: {DEFAULT_FILES}, "
                         f"with --ops {OP_FILES}")
    ap.add_argument("--ops", action="store_true",
                    help="JAX's op tests: every jitted program and eager primitive traced by JAX and evaluated by "
                         "spmdsim on one virtual device (report: REPORT_OPS.md, OUTCOMES_OPS.json)")
    ap.add_argument("--generated-cases", type=int, default=None, metavar="N",
                    help="JAX_NUM_GENERATED_CASES for both runs (JAX's default 10 when not given)")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression, for both runs")
    ap.add_argument("--test-timeout", type=float, default=300, help="seconds per test (default %(default)s)")
    ap.add_argument("--wall-timeout", type=float, default=4 * 3600, help="seconds per file and run")
    ap.add_argument("--rerun-jax", action="store_true", help="run on JAX even if its outcomes are kept")
    ap.add_argument("--resume", action="store_true", help="continue interrupted spmdsim runs")
    ap.add_argument("--only-jax", action="store_true", help="only the JAX runs")
    ap.add_argument("--stream", action="store_true", help="show pytest's output instead of logging it")
    ap.add_argument("--no-report", action="store_true", help="print the summary only (REPORT.md unchanged)")
    ap.add_argument("--jax-config", action="append", default=[], metavar="NAME=VALUE",
                    help="diagnostic: override one of JaxTestCase's defaults (or a jax option) in the spmdsim runs, "
                         "e.g. jax_enable_checks=False; reports to results/REPORT.partial.md")
    ap.add_argument("--in-jax-jit", action="store_true",
                    help="issue 39's measurement: only JAX's shard_map is spmdsim's (jax.jit, jax.pmap stay JAX's, "
                         "so a map inside a jit lowers to spmdsim's callback); the JAX runs are the maps' own "
                         "(report: REPORT_IN_JIT.md, REPORT_IN_JIT.outcomes.json)")
    ap.add_argument("--report-only", action="store_true", help="run nothing: report the runs kept in results/")
    ap.add_argument("--mirror", default=MIRROR, help="JAX's git repository (default %(default)s)")
    ap.add_argument("--tag", default=None,
                    help="the tag or commit of JAX's repository whose tests to run (default: jax-v<installed "
                         "version>; for a release the mirror has no tag of, name the nearest and say so)")
    # one per JAX release: runs under two venvs at once extract other tags' files (one run's files were overwritten)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(),
                                                      f"spmdsim-jax-suite-{os.getuid()}-{metadata.version('jax')}"))
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--report", default=None, help="default: REPORT.md here (REPORT_OPS.md with --ops)")
    args = ap.parse_args(argv)
    kind = "ops" if args.ops else "maps"
    sim_kind = "injit" if args.in_jax_jit else kind  # the spmdsim runs' (the JAX runs are the same for both)
    default_report = os.path.join(HERE, "REPORT_OPS.md" if args.ops else "REPORT.md")
    if args.in_jax_jit and not args.report:
        args.report = os.path.join(HERE, "REPORT_IN_JIT.md")
    args.report = args.report or default_report
    args.files = args.files or (OP_FILES if args.ops else DEFAULT_FILES)
    if args.generated_cases is not None:
        os.environ["JAX_NUM_GENERATED_CASES"] = str(args.generated_cases)
    generated = os.environ.get("JAX_NUM_GENERATED_CASES")

    version = jax_version()
    tag = args.tag or f"jax-v{version}"
    by_file: dict[str, list[str]] = {}
    for spec in args.files:
        file, _, rest = spec.partition("::")
        by_file.setdefault(os.path.basename(file), []).extend([f"{os.path.basename(file)}::{rest}"] if rest else [])
    config = {}
    for item in args.jax_config:
        name, _, value = item.partition("=")
        try:
            config[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            config[name] = value
    partial_run = bool(args.keyword or any(by_file.values()) or config)
    extracted = extract(args.mirror, tag, list(by_file), args.workdir)
    os.makedirs(args.results, exist_ok=True)
    print(f"jax_suite: jax {version}; extracted {', '.join(extracted)} at {tag} into {args.workdir}", flush=True)

    selection = {"jax": version, "keyword": args.keyword, **({"tag": tag} if args.tag else {}), **({"kind": kind} if args.ops else {}),
                 **({"generated_cases": generated} if generated else {})}
    started = time.monotonic()
    per_file = {}
    for file, nodeids in by_file.items():
        selection_f = dict(selection, nodeids=nodeids)

        def run(mode: str, reuse: bool, resume: bool = False) -> dict:
            """The run of ``file`` under ``mode``: done now, or (``reuse``) the kept one of this selection."""
            cfg = config if mode != "jax" else None
            k = kind if mode == "jax" else sim_kind
            meta_path = os.path.join(args.results, f"{file.removesuffix('.py')}.{_label(mode, cfg, k)}.meta.json")
            kept = json.load(open(meta_path)) if os.path.exists(meta_path) else None
            if reuse and kept and kept["selection"] == selection_f and (kept["run"]["complete"] or
                                                                          args.report_only):
                print(f"jax_suite: {file} on {mode}: kept outcomes of {kept['run'].get('date', '?')}", flush=True)
                return kept["run"]
            if args.report_only:
                sys.exit(f"jax_suite: --report-only, but no {mode} run of {file} for this selection in "
                         f"{args.results}.")
            print(f"jax_suite: {file} on {mode} ...", flush=True)
            info = {"date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
                    "commit": _git_commit(), "load": ", ".join(f"{x:.1f}" for x in os.getloadavg())}
            result = run_file(file, mode, workdir=args.workdir, results=args.results, keyword=args.keyword,
                              nodeids=nodeids, test_timeout=args.test_timeout, wall_timeout=args.wall_timeout,
                              resume=resume, stream=args.stream, config=cfg, kind=k)
            result.update(info)
            with open(meta_path, "w") as f:
                json.dump({"selection": selection_f, "run": result}, f, indent=1)
            print(f"jax_suite: {file} on {mode} took {result['seconds']} s", flush=True)
            return result

        jax_run = run("jax", reuse=not args.rerun_jax)
        if args.only_jax:
            continue
        jax_tests = outcomes(read_records(jax_run["records"]))
        out_of_scope = scope_classifier(os.path.join(args.workdir, "tests", file))
        for executor in args.executor:
            sim_run = run(executor, reuse=args.report_only, resume=args.resume)
            sim_tests = outcomes(read_records(sim_run["records"]))
            c = compare(jax_tests, sim_tests, out_of_scope)
            per_file[(file, executor)] = {"compare": c, "jax_run": jax_run, "sim_run": sim_run,
                                          "jax": jax_tests, "sim": sim_tests}
            print("\n".join(summary_lines(file, executor, c)), flush=True)
            for key, tests in causes(c["failing"]["in"])[:8]:
                print(f"    {len(tests):4d}  {key}   e.g. {short(tests[0][0])}", flush=True)
    if args.only_jax:
        return 0

    outcomes_path = os.path.join(HERE, "OUTCOMES_OPS.json" if args.ops else "OUTCOMES.json")
    if args.report != default_report:  # another release's or selection's report: its outcomes beside it
        outcomes_path = os.path.splitext(args.report)[0] + ".outcomes.json"
    previous = json.load(open(outcomes_path)) if os.path.exists(outcomes_path) else {}
    current = {f"{executor}:{nid}": {"jax": d["jax"][nid]["outcome"],
                                      "spmdsim": d["sim"].get(nid, {"outcome": "not run"})["outcome"],
                                      "cause": cause_key(d["sim"].get(nid, {}).get("message", []))
                                      if d["sim"].get(nid, {}).get("outcome") in NOT_PASSING else None}
               for (file, executor), d in per_file.items() for nid in d["jax"]}
    changes = [f"`{k}`: {previous[k]['spmdsim']} -> {v['spmdsim']}" for k, v in sorted(current.items())
               if k in previous and previous[k]["spmdsim"] != v["spmdsim"]]
    total = round(time.monotonic() - started, 1)
    print(f"jax_suite: done in {total} s", flush=True)
    if changes:
        print(f"jax_suite: {len(changes)} tests changed outcome on spmdsim since OUTCOMES.json was written")
    if args.no_report:
        return 0
    if partial_run:
        report = args.report if args.report != default_report else \
            os.path.join(args.results, "REPORT_OPS.partial.md" if args.ops else "REPORT.partial.md")
    else:
        report = args.report
        with open(outcomes_path, "w") as f:  # one line per test, for diffs
            f.write("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(current.items()))
                    + "\n}\n")
    meta = {"files": list(by_file), "jax": version, "tag": tag, "mirror": args.mirror,
            "executors": args.executor, "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
            "cores": os.cpu_count(), "machine": f"{platform.machine()}, {platform.python_implementation()} "
            f"{platform.python_version()}", "test_timeout": args.test_timeout,
            "keyword": args.keyword, "nodeids": [n for v in by_file.values() for n in v], "seconds": total,
            "config": config, "kind": kind, "generated_cases": generated, "isa": _isa() if args.ops else None}
    write_report(report, meta, per_file, changes)
    print(f"jax_suite: wrote {os.path.relpath(report)}" + ("" if partial_run else f" and {os.path.basename(outcomes_path)}"))
    return 0
