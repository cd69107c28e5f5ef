"""Issue 41: the mismatch report lists every device's call in device order, says the same thing however the
devices arrive, and its table agrees with its header (both front ends)."""
import re
import time

import numpy as np
import pytest

import spmdsim
from spmdsim import lax
from terminal import jax_installed


def _late(device: int):
    """A mapped function in which device 1 calls pmax and the others psum, and ``device`` arrives last."""
    def f(v):
        i = int(lax.axis_index("i"))
        if i == device:
            time.sleep(0.05)
        if i == 1:
            return lax.pmax(v, "i")
        return lax.psum(v, "i")
    return f


def _report(f) -> str:
    with pytest.raises(spmdsim.CollectiveMismatchError) as info:
        spmdsim.pmap(f, axis_name="i")(np.arange(3.0))
    return re.sub(r"\S*test_issue41_reports\.py:\d+", "SITE", str(info.value))


def test_the_mismatch_report_is_in_device_order_whatever_the_order_of_arrival():
    reports = {_report(_late(d)) for d in (0, 1, 2)}   # device 0, 1 or 2 last: one report
    assert len(reports) == 1, reports
    text = reports.pop()
    calls = re.findall(r"^  (device \d) \[i=\d\]: (\w+)\(", text, re.M)
    assert calls == [("device 0", "psum"), ("device 1", "pmax"), ("device 2", "psum")], text


def test_the_mismatch_table_shows_the_call_its_header_names():
    text = _report(_late(0))
    rows = dict(re.findall(r"^(device \d \[i=\d\])  +(\S.*)$", text, re.M))
    assert re.match(r"waiting +pmax\(float64\[\]\) +'i' +0 +SITE$", rows["device 1 [i=1]"]), text
    for label in ("device 0 [i=0]", "device 2 [i=2]"):
        assert re.match(r"waiting +psum\(float64\[\]\) +'i' +0 +SITE$", rows[label]), text


def test_a_mismatch_with_a_device_that_returned_names_the_callers_and_the_returned_device():
    def f(v):
        i = int(lax.axis_index("i"))
        if i == 2:
            time.sleep(0.05)
            return v
        return lax.pmax(v, "i") if i == 1 else lax.psum(v, "i")

    text = _report(f)
    assert re.findall(r"^  (device \d) \[i=\d\]: (\w+)\(", text, re.M) == [("device 0", "psum"), ("device 1", "pmax")]
    assert re.search(r"^device 2 \[i=2\]  returned$", text, re.M), text


@pytest.mark.skipif(not jax_installed(), reason="needs jax")
def test_the_jax_front_ends_mismatch_table_agrees_with_its_header():
    import jax

    import spmdsim.jax as sj

    def f(v):
        return jax.lax.cond(jax.lax.axis_index("i") == 1, lambda u: jax.lax.pmax(u, "i"),
                            lambda u: jax.lax.psum(u, "i"), v)

    with pytest.raises(spmdsim.CollectiveMismatchError) as info:
        sj.pmap(f, axis_name="i")(np.arange(3.0, dtype=np.float32))
    text = str(info.value)
    header = dict(re.findall(r"^  (device \d \[i=\d\]): (\w+)\(", text, re.M))
    table = dict(re.findall(r"^(device \d \[i=\d\])  +\w+ +(\w+)\(", text, re.M))
    assert header == table == {"device 0 [i=0]": "psum", "device 1 [i=1]": "pmax", "device 2 [i=2]": "psum"}, text
