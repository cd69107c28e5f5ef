"""Teaching pictures and the timeline, checked by their SVG geometry: every label fits its cell, large
blocks are elided to a bounded width, panels sit side by side without gaps, a legend names the colours;
pictures show inline in Jupyter; rich tables are not cut when the output is not a terminal."""
import io
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import spmdsim
from spmdsim import lax

SVG = "{http://www.w3.org/2000/svg}"
CHAR_EM = 0.6  # the advance of a monospace character (DejaVu Sans Mono, Courier)


def parse(picture):
    root = ET.fromstring(picture.svg)
    return root, float(root.get("width"))


def text_extent(t):
    """(left, right) of a <text> element in a monospace font."""
    width = len(t.text or "") * CHAR_EM * float(t.get("font-size"))
    x = float(t.get("x"))
    return {"start": (x, x + width), "middle": (x - width / 2, x + width / 2), "end": (x - width, x)}[
        t.get("text-anchor", "start")]


def cells(root):
    """(rect, text) of every cell of every panel."""
    return [(g.find(SVG + "rect"), g.find(SVG + "text")) for g in root.iter(SVG + "g") if g.get("class") == "cell"]


def assert_every_text_fits(root, width):
    for rect, t in cells(root):
        left, right = text_extent(t)
        x, w = float(rect.get("x")), float(rect.get("width"))
        assert x <= left and right <= x + w, f"label {t.text!r} ({right - left:.0f} px) overflows its cell ({w} px)"
    for t in root.iter(SVG + "text"):
        left, right = text_extent(t)
        assert 0 <= left and right <= width, f"text {t.text!r} runs off the picture"


def legend(root):
    return [g.find(SVG + "text").text for g in root.iter(SVG + "g") if g.get("class") == "legend"]


def test_labels_fit_their_cells():
    x = np.array([[-0.0506, 123456.0, -1.5e-7, 0.3333], [7.0, -0.25, 1e10, 2.0]])
    pic = spmdsim.show.collective("psum", x, echo=False)
    root, width = parse(pic)
    assert_every_text_fits(root, width)
    assert "-0.0506" in [t.text for _, t in cells(root)]
    root, width = parse(spmdsim.show.sharding(np.arange(12_345_678, 12_345_690).reshape(3, 4), 1, echo=False))
    assert_every_text_fits(root, width)


def test_large_blocks_are_elided_to_a_bounded_width():
    x = np.random.default_rng(0).standard_normal((4, 100))
    root, width = parse(spmdsim.show.collective("psum", x, echo=False))
    assert width <= 1400
    labels = [t.text for _, t in cells(root)]
    assert labels.count("…") == 8 and len(labels) == 8 * 9     # 4 devices x before/after, 4 + … + 4 cells
    assert_every_text_fits(root, width)
    root, width = parse(spmdsim.show.sharding(np.zeros((50, 60)), in_axes=0, echo=False))
    assert width <= 1400 and len(cells(root)) == 9 * 9


def test_tiled_all_gather_panels_sit_side_by_side_without_a_gap():
    root, width = parse(spmdsim.show.collective("all_gather", np.arange(8.0).reshape(4, 2), tiled=True, echo=False))
    rows = {}
    for rect, _ in cells(root):
        rows.setdefault(float(rect.get("y")), []).append((float(rect.get("x")), float(rect.get("width"))))
    for y, spans in rows.items():
        spans.sort()
        gaps = [b[0] - (a[0] + a[1]) for a, b in zip(spans, spans[1:])]   # at most the header "before (2,)"
        # overhangs its 2 cells, plus the spacing (every panel as wide as the widest was 288 px apart)
        assert len(spans) == 2 + 8 and max(gaps) <= 60, f"a gap of {max(gaps)} px between before and after"
    assert width <= 800


def test_a_legend_names_each_devices_colour():
    pic = spmdsim.show.collective("ppermute", np.arange(4.0), perm=[(0, 1), (1, 2), (2, 3)], echo=False)
    root, width = parse(pic)
    assert legend(root) == ["device 0", "device 1", "device 2", "device 3", "zeros (received nothing)"]
    swatch = {g.find(SVG + "text").text: g.find(SVG + "rect").get("fill") for g in root.iter(SVG + "g")
              if g.get("class") == "legend"}
    fills = [rect.get("fill") for rect, _ in cells(root)]       # device 0 before, after, device 1 before, ...
    assert fills[0] == swatch["device 0"] and fills[3] == swatch["device 0"]   # device 1 received device 0's
    assert fills[1] == swatch["zeros (received nothing)"]
    assert_every_text_fits(root, width)


def test_sharding_with_in_axes_none_is_replicated():
    pic = spmdsim.show.sharding(np.arange(6).reshape(2, 3), in_axes=None, axis_size=4, echo=False)
    assert re.search(r"device 3\s+x \(all of it\)\s+\(2, 3\)", pic.text)
    root, _ = parse(pic)
    assert legend(root) == ["every device holds it (replicated)"] and len(cells(root)) == 6
    with pytest.raises(TypeError, match="in_axes must be an int or None, got 'x'"):
        spmdsim.show.sharding(np.zeros(3), in_axes="x")
    with pytest.raises(ValueError, match=r"in_axes=2 is out of range for x of shape \(3,\)"):
        spmdsim.show.sharding(np.zeros(3), in_axes=2)


def test_sharding_picture(tmp_path):
    pic = spmdsim.show.sharding(np.arange(12).reshape(3, 4), in_axes=1, svg=str(tmp_path / "s.svg"), echo=False)
    assert "device 2  x[:, 2]  (3,)" in pic.text and "[ 2,  6, 10]" in pic.text
    root = ET.parse(tmp_path / "s.svg").getroot()
    colours = [rect.get("fill") for rect, _ in cells(root)]
    assert len(colours) == 12 and colours[0] == colours[4] == colours[8] != colours[1]   # column j: device j


def test_collective_picture():
    pic = spmdsim.show.collective("psum_scatter", np.arange(16.0).reshape(4, 4), echo=False)
    assert re.search(r"device 1  \[4., 5., 6., 7.\]\s+28.", pic.text)        # column sums: 24, 28, 32, 36
    with pytest.raises(ValueError, match="'psun' is not a collective of spmdsim.lax"):
        spmdsim.show.collective("psun", np.zeros(2))


def test_pictures_show_inline_in_jupyter_and_print_as_text(capsys):
    pic = spmdsim.show.sharding(np.arange(4), in_axes=0)
    printed = capsys.readouterr().out
    assert "device 3" in printed                       # echo: the table is printed
    assert pic._repr_svg_().startswith("<svg") and "<svg" in pic._repr_html_()
    assert str(pic) == pic.text and "device 3" in repr(pic) or "Picture" in repr(pic)


def test_timeline_has_a_time_axis_and_a_legend(tmp_path):
    def program(x):
        y = lax.psum(x, "i")
        return lax.all_gather(lax.ppermute(y, "i", [(0, 1), (1, 0)]), "i")

    with spmdsim.trace() as tr:
        spmdsim.pmap(program, axis_name="i")(np.zeros((2, 3)))
    pic = tr.to_svg(tmp_path / "t.svg")
    root = ET.parse(tmp_path / "t.svg").getroot()
    assert pic._repr_svg_() == (tmp_path / "t.svg").read_text()
    width = float(root.get("width"))
    assert any(line.get("class") == "time-axis" for line in root.iter(SVG + "line"))
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "0" in texts and "time since the first device started (ms)" in texts
    assert legend(root) == ["a device's mapped call", "psum: arrival to release", "ppermute: arrival to release",
                            "all_gather: arrival to release"]
    for t in root.iter(SVG + "text"):
        left, right = text_extent(t)
        assert 0 <= left and right <= width, t.text


def test_rich_tables_are_not_cut_when_not_a_terminal():
    pytest.importorskip("rich")
    with spmdsim.trace() as tr:
        spmdsim.pmap(lambda v: lax.psum(v, "i"), "i")(np.zeros(8))
    out = io.StringIO()
    tr.summary(file=out)
    printed = out.getvalue()
    assert "bytes/device" in printed and "slowest device" in printed and "device " in printed
    assert re.search(r"device \d \[i=\d\]", printed)    # the label whole, not eaten as markup
    assert "…" not in printed
