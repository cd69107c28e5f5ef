"""docs/: the tutorial notebooks run top to bottom (so they cannot rot; those that import jax only where it is
installed), the docs site builds with ``mkdocs build --strict`` with every page in its nav and each notebook
rendered as a page with its outputs, README.md and every docs page's examples (their ```pycon blocks) print
what the page says they print, the getting-started page says how to open the notebooks and how to test quickly,
and every docstring example runs as a doctest. Needs the test extra's nbclient, ipykernel, mkdocstrings and
mkdocs-jupyter; never imports jax itself (a page whose examples use jax runs them in a subprocess, and only where
jax is installed).

``python tests/test_docs.py PAGE.md ...`` runs the pages' examples and prints what failed."""
import doctest
import importlib
import os
import pkgutil
import re
import subprocess
import sys

import pytest

import spmdsim
from terminal import ROOT, jax_installed

sys.path.insert(0, os.path.join(ROOT, "docs"))
import make_figures  # noqa: E402

NOTEBOOKS = make_figures.notebooks()

# Warnings the API build still gives for docstrings being rewritten elsewhere (issue 16's error work): their
# Raises sections are prose, not "Exception: description". Each entry must still occur (like a strict xfail);
# delete it once its docstring is converted, and the build is then strict there too.
KNOWN_WARNINGS: set = set()


def outputs(book, mime=None):
    """Every cell's stream text (mime None) or every output of that mime type, in order."""
    found = []
    for cell in book.cells:
        for out in cell.get("outputs", []):
            if mime is None and out["output_type"] == "stream":
                found.append(out["text"])
            elif mime is not None and mime in out.get("data", {}):
                found.append(out["data"][mime])
    return found


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav lists, in order (paths under docs/)."""
    yaml = pytest.importorskip("yaml")   # mkdocs's

    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        nav = yaml.safe_load(f)["nav"]

    def walk(entries):
        for entry in entries:
            for value in (entry.values() if isinstance(entry, dict) else [entry]):
                yield from walk(value) if isinstance(value, list) else [value]
    return list(walk(nav))


def test_the_tutorial_is_a_series_and_every_page_is_in_the_nav():
    assert [os.path.basename(p) for p in NOTEBOOKS[:5]] == [
        "1_what_is_spmd.ipynb", "2_in_axes_out_axes.ipynb", "3_named_axes_and_collectives.ipynb",
        "4_data_parallel_training.ipynb", "5_a_deadlock_found_and_fixed.ipynb"]
    pages = sorted(os.path.relpath(os.path.join(folder, name), os.path.join(ROOT, "docs"))
                   for folder, _, names in os.walk(os.path.join(ROOT, "docs"))
                   for name in names if name.endswith((".md", ".ipynb")) and ".ipynb_checkpoints" not in folder)
    assert sorted(nav_pages()) == pages
    assert [p for p in nav_pages() if p.startswith("tutorial/")] == [os.path.relpath(p, os.path.join(ROOT, "docs"))
                                                                     for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p)[0] for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    with open(path) as f:
        uses_jax = '"import jax' in f.read()
    if uses_jax and not jax_installed():
        pytest.skip("this notebook needs jax")
    book = make_figures.execute(path, write=False, env={"PYTHONPATH": ROOT}, timeout=180 if uses_jax else 60)
    text = "".join(outputs(book))
    name = os.path.basename(path)
    if name.startswith("1_"):
        assert "device 0 | I hold 0.0\ndevice 1 | I hold 1.0\n" in text     # labelled device output in Jupyter
    if name.startswith(("1_", "2_", "3_", "4_")):
        assert outputs(book, "image/svg+xml"), "the pictures render inline"
    if name.startswith("4_"):
        gap = float(re.search(r"largest difference from lstsq: (\S+)", text).group(1))
        assert gap < 1e-3
    if name.startswith("5_"):
        assert "can never complete" in text and "CollectiveDeadlockError - the program ends with the error" in text
        assert re.search(r"waiting in psum.*local = [46]\.5", text)     # a held device's variable, read


def test_docs_site_builds_strictly_with_the_notebooks_rendered_as_pages(tmp_path):
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("mkdocs_jupyter")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    known = {k for k in KNOWN_WARNINGS if any(k[0] in w and k[1] in w for w in warnings)}
    unexpected = [w for w in warnings if not any(f in w and m in w for f, m in KNOWN_WARNINGS)]
    assert not unexpected, "\n".join(unexpected)
    assert known == KNOWN_WARNINGS, f"no longer warned, delete from KNOWN_WARNINGS: {KNOWN_WARNINGS - known}"
    page = (tmp_path / "site" / "api" / "debug" / "index.html").read_text()
    assert "Breakpoint" in page and "Evaluate" in page
    # Each notebook is a page with its cells and stored outputs (not the raw JSON), and a link to download it.
    for path in NOTEBOOKS:
        name = os.path.basename(path)[:-len(".ipynb")]
        page = (tmp_path / "site" / "tutorial" / name / "index.html").read_text()
        assert '"cell_type"' not in page and "import spmdsim" in page, name
        assert (tmp_path / "site" / "tutorial" / name / f"{name}.ipynb").exists()
        # The only link to a notebook file is the download link (links to other notebooks go to their pages).
        assert re.findall(r'href="([^"]*\.ipynb)"', page) == [f"{name}.ipynb"], name
        if name.startswith(("1_", "2_", "3_", "4_")):
            assert "<svg" in page, f"{name}: the pictures are drawn"
    page = (tmp_path / "site" / "tutorial" / "1_what_is_spmd" / "index.html").read_text()
    assert "device 0 | I hold 0.0" in page and 'href="../2_in_axes_out_axes/"' in page
    assert "2. in_axes and out_axes</a>" in page   # the nav's titles
    home = (tmp_path / "site" / "index.html").read_text()
    assert 'href="tutorial/1_what_is_spmd/"' in home and 'href="notes/shard_map_jax_0_10_2/"' in home


def test_the_notebooks_extra_and_the_getting_started_page_say_how_to_open_the_notebooks_and_test_quickly():
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert {"jupyterlab>=4", "ipykernel>=6.29"} <= set(extras["notebooks"])
    assert set(extras["docs"]) <= set(extras["test"])   # CI builds the docs site
    with open(os.path.join(ROOT, "docs", "getting_started.md")) as f:
        page = f.read()
    assert 'python -m pip install ".[notebooks]"' in page and "jupyter lab docs/tutorial" in page
    assert "python -m pytest tests" in page                          # the quick check
    assert re.search(r"full suite takes about \d+ minutes", page)     # and how long the second command runs
    # Every package of the test extra is named where the page says what the second command installs.
    installs = page[page.index("The second installs"):page.index("runs the whole test suite")]
    for requirement in extras["test"]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        assert name in installs, f"getting_started.md does not list {name} of the test extra"


def test_readme_is_the_front_door():
    """README: what spmdsim is, then the two set-up commands (.ci/run runs the second), short, its links to the
    docs pages resolve (as they do on GitHub)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert len(readme.splitlines()) <= 200
    first_block = readme[readme.index("```bash\n") + len("```bash\n"):readme.index("\n```", readme.index("```bash"))]
    assert first_block.splitlines() == [
        "python -m pip install . && python -m spmdsim demo",
        'python -m pip install ".[test]" && python -m pytest -n auto --maxprocesses=4 --dist loadfile']
    assert readme.index("**spmdsim** is") < readme.index("```bash")
    links = re.findall(r"\]\(((?:docs|benchmarks)/[^)#]*)(?:#[^)]*)?\)", readme)
    assert {f"docs/{page}" for page in ("getting_started.md", "numpy_frontend.md", "jax_programs.md",
                                        "shard_map_and_meshes.md", "debugging.md", "compare_and_conformance.md",
                                        "multihost.md", "performance.md", "semantics.md",
                                        "architecture.md")} <= set(links)
    for link in links:
        assert os.path.exists(os.path.join(ROOT, link)), link


# README.md and the docs pages whose examples are executed. A ```pycon block is a doctest: `>>>` and `...` lines
# are run and the lines after them are what they print (ELLIPSIS and NORMALIZE_WHITESPACE); the blocks of a page
# share one namespace, top to bottom. A block that imports jax runs only where jax is installed; a page with such
# blocks runs in a fresh interpreter (JAX's threads must not follow this process into its later forks).
PAGES = ["README.md"] + sorted(os.path.relpath(os.path.join(folder, name), ROOT)
                               for folder, _, names in os.walk(os.path.join(ROOT, "docs"))
                               for name in names if name.endswith(".md"))
PAGES_WITH_EXAMPLES = {"README.md", "docs/getting_started.md", "docs/numpy_frontend.md", "docs/jax_programs.md",
                       "docs/shard_map_and_meshes.md", "docs/debugging.md", "docs/compare_and_conformance.md",
                       "docs/multihost.md", "docs/performance.md", "docs/semantics.md", "docs/architecture.md"}
_PYCON = re.compile(r"^```pycon\n(.*?)^```$", re.S | re.M)
_OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def examples(path: str) -> list[str]:
    """The page's ```pycon blocks (path relative to the repository's root), in order."""
    with open(os.path.join(ROOT, path)) as f:
        return _PYCON.findall(f.read())


def needs_jax(block: str) -> bool:
    return bool(re.search(r"^(?:>>>|\.\.\.) .*(?:(?<![\w.])jax\b|spmdsim\.jax|\bjnp\b)", block, re.M))


def run_examples(path: str, *, with_jax: bool) -> tuple[int, int, str]:
    """Run a page's examples as one doctest; returns (failed, attempted, the failure report)."""
    blocks = [b for b in examples(path) if with_jax or not needs_jax(b)]
    test = doctest.DocTestParser().get_doctest("\n".join(blocks), {"__name__": "__main__"}, path, path, 0)
    report = []
    runner = doctest.DocTestRunner(optionflags=_OPTIONS)
    cwd = os.getcwd()
    os.chdir(ROOT)   # examples name files relative to the repository's root
    try:
        with spmdsim.set_device_count(8):
            result = runner.run(test, out=report.append, clear_globs=True)
    finally:
        os.chdir(cwd)
    return result.failed, result.attempted, "".join(report)


@pytest.mark.parametrize("path", PAGES)
def test_page_examples_print_what_the_page_says(path):
    blocks = examples(path)
    assert bool(blocks) == (path in PAGES_WITH_EXAMPLES), f"{path}: its examples are ```pycon blocks"
    if not blocks:
        return
    if any(map(needs_jax, blocks)) and jax_installed():
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "test_docs.py"), path], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return
    if all(map(needs_jax, blocks)):
        pytest.skip("this page's examples need jax")
    failed, attempted, report = run_examples(path, with_jax=False)
    assert failed == 0, report
    assert attempted > 0


def docstring_modules():
    names = [m.name for m in pkgutil.walk_packages(spmdsim.__path__, "spmdsim.")
             if not m.name.startswith(("spmdsim.jax", "spmdsim.__main__"))]   # spmdsim.jax needs jax
    return [spmdsim] + [importlib.import_module(name) for name in names]


def test_docstring_examples_run():
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    examples = 0
    for module in docstring_modules():
        for test in finder.find(module):
            result = runner.run(test, out=lambda text: None)
            assert result.failed == 0, f"doctest {test.name} fails; run python -m doctest -v on {module.__file__}"
            examples += result.attempted
    assert examples >= 15


if __name__ == "__main__":
    status = 0
    for page in sys.argv[1:]:
        failed, attempted, report = run_examples(page, with_jax=jax_installed())
        print(f"{page}: {attempted - failed} of {attempted} examples print what the page says", flush=True)
        if failed:
            print(report)
            status = 1
    sys.exit(status)
