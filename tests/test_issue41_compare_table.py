"""Issue 41: spmdsim compare's end-to-end table says how many rows it left out, as the equations table does."""
import pytest

pytest.importorskip("jax")

from spmdsim.jax.tools._compare_report import Drift, Report  # noqa: E402


def _report(n: int) -> Report:
    return Report("xla", 0, None, compared=n,
                  drift=[Drift(k, "pmap", 0, (4,), "float32", 0.0, 0.0) for k in range(n)])


@pytest.mark.parametrize("n, max_rows, left_out", [(53, 50, "... and 3 more rows (--json has them all)"),
                                                   (51, 50, "... and 1 more row (--json has them all)"),
                                                   (7, 5, "... and 2 more rows (--json has them all)")])
def test_the_end_to_end_table_counts_the_rows_left_out(n, max_rows, left_out):
    text = _report(n).text(max_rows=max_rows)
    assert text.splitlines()[-1] == left_out, text
    calls = [int(line.split()[0]) for line in text.splitlines() if line.split()[1:2] == ["pmap"]]
    assert calls == list(range(max_rows)), text                              # the first max_rows calls shown


def test_the_end_to_end_table_within_the_limit_has_no_such_line():
    assert "more row" not in _report(50).text(max_rows=50)
