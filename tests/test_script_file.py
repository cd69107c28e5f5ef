"""``spmdsim run``/``spmdsim debug`` run a script as ``python SCRIPT.py`` does (issue 25, point 7c): ``__file__``
and the code's file names absolute (Python 3.9 and later; JAX's error messages print them), ``sys.argv[0]`` as
typed, the script's folder (symlinks resolved) first on ``sys.path``, a fresh ``__main__``. Compared with the same
script under ``python`` itself; needs no jax (the runner, :func:`spmdsim.tools._script.run_program`, imports none)."""
import json
import os
import subprocess
import sys

import pytest

from spmdsim.tools._script import Program, run_program

SCRIPT = """import json, os, sys
def where():
    return where.__code__.co_filename
main = sys.modules["__main__"]
facts = {"file": __file__, "code": where(), "argv0": sys.argv[0], "path0": sys.path[0], "name": __name__,
         "package": __package__, "spec": __spec__ is None, "cached": __cached__, "main_is_me": main.__dict__ is globals(),
         "loader": type(__loader__).__name__, "args": sys.argv[1:],
         "builtins": type(__builtins__).__name__}
with open(os.environ["FACTS_OUT"], "w") as f:
    json.dump(facts, f)
"""


def facts_under_python(script: str, cwd, out, *args) -> dict:
    subprocess.run([sys.executable, script, *args], cwd=cwd, check=True, timeout=60,
                   env={**os.environ, "FACTS_OUT": str(out)})
    with open(out) as f:
        return json.load(f)


def facts_under_spmdsim(script: str, cwd, out, monkeypatch, *args) -> dict:
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("FACTS_OUT", str(out))
    saved_main = sys.modules["__main__"]
    assert run_program(Program(script, None, tuple(args))) == 0
    assert sys.modules["__main__"] is saved_main  # given back
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("typed", ["prog.py", "./prog.py", "sub/prog.py", "ABS"])
def test_a_script_sees_what_python_gives_it(tmp_path, monkeypatch, typed):
    (tmp_path / "sub").mkdir()
    where = tmp_path / "sub" if typed == "prog.py" or typed == "./prog.py" else tmp_path
    path = tmp_path / "sub" / "prog.py"
    path.write_text(SCRIPT)
    typed = str(path) if typed == "ABS" else typed
    python = facts_under_python(typed, where, tmp_path / "python.json", "a", "--b")
    simulated = facts_under_spmdsim(typed, where, tmp_path / "spmdsim.json", monkeypatch, "a", "--b")
    assert simulated == python
    assert simulated["file"] == simulated["code"] == os.path.join(where, typed)  # absolute, not normalised
    assert simulated["argv0"] == typed


def test_a_symlinked_script_runs_from_the_link_with_its_target_folder_on_the_path(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "prog.py").write_text(SCRIPT)
    os.symlink(tmp_path / "real" / "prog.py", tmp_path / "link.py")
    python = facts_under_python("link.py", tmp_path, tmp_path / "python.json")
    simulated = facts_under_spmdsim("link.py", tmp_path, tmp_path / "spmdsim.json", monkeypatch)
    assert simulated == python
    assert simulated["file"] == str(tmp_path / "link.py") and simulated["path0"] == str(tmp_path / "real")


def test_a_traceback_names_the_script_by_its_absolute_path(tmp_path, monkeypatch, capsys):
    (tmp_path / "bad.py").write_text("def f():\n    raise ValueError('from the script')\nf()\n")
    monkeypatch.chdir(tmp_path)
    assert run_program(Program("bad.py", None, ())) == 1
    err = capsys.readouterr().err
    python = subprocess.run([sys.executable, "bad.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert err == python.stderr
    assert f'File "{tmp_path / "bad.py"}", line 2, in f' in err


def test_a_folder_with_main_runs_as_python_runs_it_but_for_argv0(tmp_path, monkeypatch):
    """runpy runs a folder (its ``__main__.py`` found on ``sys.path``) and sets ``sys.argv[0]`` to the path it is
    given, the absolute one here; Python leaves it as typed."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(SCRIPT)
    python = facts_under_python("app", tmp_path, tmp_path / "python.json")
    simulated = facts_under_spmdsim("app", tmp_path, tmp_path / "spmdsim.json", monkeypatch)
    assert python.pop("argv0") == "app" and simulated.pop("argv0") == str(tmp_path / "app")
    python.pop("builtins"), simulated.pop("builtins")  # runpy's __main__ holds builtins' dict
    assert simulated == python
    assert simulated["file"] == str(tmp_path / "app" / "__main__.py")
