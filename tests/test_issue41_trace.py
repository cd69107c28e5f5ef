"""Issue 41: the trace's summary and its timeline count the same things in the same words, plurals right."""
import re
import time

import numpy as np

import spmdsim
from spmdsim import lax
from spmdsim.tools._trace import Trace


def _panels(svg: str) -> list[str]:
    return [t.replace("&#x27;", "'") for t in re.findall(r'class="panel"[^>]*>([^<]*)<', svg)]


def test_summary_and_timeline_agree_on_one_collective_in_one_call():
    with spmdsim.set_device_count(4), spmdsim.trace() as tr:
        spmdsim.pmap(lambda x: lax.psum(x, "i"), "i")(np.arange(4.0))
    summary = tr.summary(file=open("/dev/null", "w")).splitlines()[0].strip()
    picture = tr.to_svg()
    assert summary == "1 collective in 1 mapped call (4 device calls)"
    assert picture.text.startswith("spmdsim trace: 1 collective in 1 mapped call (4 device calls), ")
    assert _panels(picture.svg) == ["4 devices over 'i': 1 mapped call, 1 collective"]


def test_summary_and_timeline_agree_on_several_calls():
    f = spmdsim.pmap(lambda x: lax.pmax(lax.psum(x, "i"), "i"), "i")
    with spmdsim.set_device_count(2), spmdsim.trace() as tr:
        f(np.arange(2.0))
        time.sleep(0.01)                                     # apart: two top-level calls
        f(np.arange(2.0))
        time.sleep(0.01)
        f(np.arange(2.0))
    summary = tr.summary(file=open("/dev/null", "w")).splitlines()[0].strip()
    picture = tr.to_svg()
    assert summary == "6 collectives in 3 mapped calls (6 device calls)"
    assert picture.text.startswith("spmdsim trace: 6 collectives in 3 mapped calls (6 device calls), ")
    assert _panels(picture.svg) == ["2 devices over 'i': 3 mapped calls, 6 collectives"]


def test_a_device_call_named_by_the_runtime_is_named_so_in_perfetto(tmp_path):
    tr = Trace()
    tr.lane("device 0", tr.origin, tr.origin + 1e-3, "returned", name="train_step")
    tr.lane("device 1", tr.origin, tr.origin + 1e-3, "returned")
    doc = tr.to_perfetto(tmp_path / "t.json")
    assert [e["name"] for e in doc["traceEvents"] if e.get("cat") == "call"] == ["train_step", "mapped call"]
