"""The supported JAX releases (issue 37): one rule in spmdsim._jax_versions, the same set in pyproject's extras,
and an unsupported JAX refused in one line before anything of its internals is imported. No jax needed: a fake
``jax`` package stands in for an unsupported release."""
from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import pytest

from spmdsim import _jax_versions as _versions

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("version, supported", [
    ("0.10.2", True), ("0.10.3", True), ("0.11.2", True), ("0.11.3", True), ("0.12.0.1", True), ("0.12.1", True),
    ("0.10.1", False), ("0.10.0", False), ("0.11.0", False), ("0.11.1", False), ("0.12.0", False),
    ("0.13.0", False), ("0.9.2", False), ("0.4.38", False), ("1.0.0", False),
    ("0.12.1.dev20261120", False), ("0.12.1rc1", False), ("0.12.0.1+cuda", True), ("garbage", False),
])
def test_supported_releases(version, supported):
    assert _versions.is_supported(version) is supported


def test_the_extras_admit_exactly_the_supported_releases():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("jax", "test"):
        jax_requirements = [r for r in extras[extra] if r.split(">")[0].split("=")[0].split("<")[0] == "jax"]
        assert jax_requirements == [_versions.REQUIREMENT], extra


def _fake_jax(tmp_path, version: str) -> dict:
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}


def test_an_unsupported_jax_is_refused_before_its_internals_are_imported(tmp_path):
    """The fake jax has no ``jax._src``: had spmdsim imported anything of it first, this would be a
    ModuleNotFoundError instead."""
    code = ("import sys\ntry:\n    import spmdsim.jax\nexcept ImportError as e:\n"
            "    print(type(e).__name__, '|', e)\n    import numpy as np, spmdsim, spmdsim.lax\n"
            "    print('numpy front end:', spmdsim.pmap(lambda x: spmdsim.lax.psum(x, 'i'), "
            "axis_name='i')(np.arange(2.)).tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], env=_fake_jax(tmp_path, "0.9.2"), capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    first, second = out.stdout.splitlines()
    assert first.startswith("UnsupportedJaxError | ")
    assert "this environment has jax 0.9.2" in first and "0.10.2, 0.11.2 and 0.12.0.1" in first
    assert "NumPy front end (spmdsim.pmap, spmdsim.shard_map" in first
    assert second == "numpy front end: [1.0, 1.0]"


def test_spmdsim_run_says_it_in_one_line(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    out = subprocess.run([sys.executable, "-m", "spmdsim", "run", str(script)], env=_fake_jax(tmp_path, "0.13.0"),
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("spmdsim run: error: spmdsim's JAX front end")
    assert "jax 0.13.0" in out.stderr


def test_the_launcher_of_hosts_says_it_once_before_any_host_starts(tmp_path):
    """``spmdsim run --hosts 2`` reads JAX's release from the installed distribution's metadata (it imports no
    JAX): an unsupported one is one line from the launcher, no host's."""
    env = _fake_jax(tmp_path, "0.13.0")
    info = tmp_path / "jax-0.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.13.0\n")
    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    out = subprocess.run([sys.executable, "-m", "spmdsim", "run", "--hosts", "2", "--devices", "4", str(script)],
                         env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("spmdsim run: error: spmdsim's JAX front end")
    assert "jax 0.13.0" in out.stderr
