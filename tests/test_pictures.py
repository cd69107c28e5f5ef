"""Teaching pictures and the timeline, checked by their SVG geometry: every label fits its cell, large
blocks are elided to a bounded width, panels sit side by side without gaps, a legend names the colours;
pictures show inline in Jupyter; rich tables are not cut when the output is not a terminal. The mesh forms
(show.sharding with mesh= and spec=, show.blocks inside a mapped function, show.collective with mesh=) are
checked against NumPy's reasoning about the layout: device 5 [x=2, y=1] of a (4, 2) mesh with P('x', 'y')
holds x[4:6, 2:4] of an (8, 4) array."""
import io
import os
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
    with spmdsim.set_device_count(50):                      # 50 blocks need 50 devices, as in pmap
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
    assert "time since the first call started (ms)" in texts
    assert re.fullmatch(r"0(\.0+)?", texts[texts.index("device 1 [i=1]") + 1])   # the first tick
    assert legend(root) == ["a device's mapped call", "psum over 'i': arrival to release",
                            "ppermute over 'i': arrival to release", "all_gather over 'i': arrival to release"]
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


# -- the mesh forms: show.sharding(mesh=, spec=), show.blocks inside a mapped function, show.collective(mesh=) --

MESH_LABEL = re.compile(r"device (\d+) \[x=(\d+), y=(\d+)\]")


def table_rows(text):
    """The table's rows that start with a device label, as {device: line}."""
    return {int(m.group(1)): line for line in text.splitlines() if (m := MESH_LABEL.match(line))}


def numbers(text):
    return [float(v) for v in re.findall(r"-?\d+\.?\d*", text)]


def test_mesh_sharding_table_is_numpys_layout():
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    x = np.arange(32).reshape(8, 4)
    pic = spmdsim.show.sharding(x, mesh=mesh, spec=spmdsim.P("x", "y"), echo=False)
    assert "device 5 [x=2, y=1]  x[4:6, 2:4]  (2, 2)       [[18, 19], [22, 23]]" in pic.text
    rows = table_rows(pic.text)
    assert sorted(rows) == list(range(8))
    for d, line in rows.items():
        i, j = divmod(d, 2)                                # row-major device numbers
        assert line.startswith(f"device {d} [x={i}, y={j}]  x[{2 * i}:{2 * i + 2}, {2 * j}:{2 * j + 2}]  (2, 2)")
        assert numbers(line.split("(2, 2)")[1]) == x[2 * i:2 * i + 2, 2 * j:2 * j + 2].ravel().tolist()
    assert "Mesh('x': 4, 'y': 2)" in pic.text and "every device holds a different block" in pic.text
    assert "copies" not in pic.text
    assert re.search(r"^mesh\s+y=0\s+y=1\nx=0\s+0\s+1\nx=1\s+2\s+3\nx=2\s+4\s+5\nx=3\s+6\s+7$", pic.text, re.MULTILINE)


def test_mesh_sharding_says_which_devices_hold_copies():
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    pic = spmdsim.show.sharding(np.arange(32).reshape(8, 4), mesh=mesh, spec=spmdsim.P("x"), echo=False)
    assert "replicated along 'y': each block is held by 2 devices" in pic.text
    rows = table_rows(pic.text)
    for d, line in rows.items():
        i = d // 2
        assert f"x[{2 * i}:{2 * i + 2}, :]" in line and line.endswith(f"devices {2 * i}, {2 * i + 1}")
    # a dimension split over two axes, the first named major: device (i, j) holds block j * 4 + i
    pic = spmdsim.show.sharding(np.arange(16).reshape(2, 8), mesh=mesh, spec=spmdsim.P(None, ("y", "x")), echo=False)
    for d, line in table_rows(pic.text).items():
        k = (d % 2) * 4 + d // 2
        assert f"x[:, {k}:{k + 1}]" in line and numbers(line.split("(2, 1)")[1]) == [k, 8 + k]
    pic = spmdsim.show.sharding(np.arange(6).reshape(2, 3), mesh=mesh, spec=spmdsim.P(), echo=False)
    assert "replicated along 'x', 'y': every one of the 8 devices holds all of x" in pic.text
    assert table_rows(pic.text)[7].endswith("devices 0, 1, 2, 3, …, 7 (8)")
    root, _ = parse(pic)
    assert legend(root) == ["x[:, :]: every device (replicated)"]
    assert {rect.get("fill") for rect, _ in cells(root)} == {"#bbbbbb"}


def test_mesh_sharding_drawing_shows_x_and_the_mesh_in_the_same_colours():
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    x = np.arange(32).reshape(8, 4)
    root, width = parse(spmdsim.show.sharding(x, mesh=mesh, spec=spmdsim.P("x"), echo=False))
    assert_every_text_fits(root, width)
    drawn = cells(root)
    assert len(drawn) == 32 + 8
    x_fills = np.array([rect.get("fill") for rect, _ in drawn[:32]]).reshape(8, 4)
    mesh_cells = drawn[32:]
    assert [t.text for _, t in mesh_cells] == [str(d) for d in range(8)]
    device_fill = [rect.get("fill") for rect, _ in mesh_cells]
    for d in range(8):               # device d holds rows 2 * (d // 2) ... of x: the same colour in both panels
        assert set(x_fills[2 * (d // 2):2 * (d // 2) + 2].ravel()) == {device_fill[d]}
    assert len(set(device_fill)) == 4
    assert legend(root) == ["x[0:2, :]: devices 0, 1", "x[2:4, :]: devices 2, 3", "x[4:6, :]: devices 4, 5",
                            "x[6:8, :]: devices 6, 7"]
    texts = [t.text for t in root.iter(SVG + "text")]
    assert all(h in texts for h in ["x=0", "x=3", "y=0", "y=1", "Mesh('x': 4, 'y': 2)"])
    # the mesh's rows are its first axis: device 2 [x=1, y=0] sits under device 0, right of nothing
    pos = {t.text: (float(r.get("x")), float(r.get("y"))) for r, t in mesh_cells}
    assert pos["2"][0] == pos["0"][0] < pos["1"][0] and pos["0"][1] == pos["1"][1] < pos["2"][1]


def test_mesh_sharding_of_a_large_array_on_a_large_mesh_is_bounded():
    with spmdsim.set_device_count(256):
        mesh = spmdsim.make_mesh((16, 16), ("x", "y"))
        pic = spmdsim.show.sharding(np.arange(64 * 64.0).reshape(64, 64), mesh=mesh, spec=spmdsim.P("x", "y"),
                                    echo=False)
    root, width = parse(pic)
    assert width <= 1400
    assert len(cells(root)) == 9 * 9 + 9 * 9              # x and the mesh, each 4 + … + 4 along both axes
    assert len(legend(root)) == 17 and legend(root)[-1] == "… 256 blocks in all"
    assert_every_text_fits(root, width)
    assert "device 255 [x=15, y=15]  x[60:64, 60:64]" in pic.text


@pytest.mark.parametrize("spec", [spmdsim.P("z"), spmdsim.P("x", "x"), spmdsim.P("x", None, None),
                                  spmdsim.P(None, "x"), "x"], ids=["unknown", "twice", "too-long", "indivisible",
                                                                   "not-a-spec"])
def test_mesh_sharding_raises_what_shard_map_raises(spec):
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    x = np.zeros((8, 2))
    with pytest.raises((ValueError, TypeError)) as expected:
        spmdsim.shard_map(lambda b: b, mesh=mesh, in_specs=spec, out_specs=spmdsim.P())(x)
    with pytest.raises(expected.type) as got:
        spmdsim.show.sharding(x, mesh=mesh, spec=spec, echo=False)
    assert str(got.value) == str(expected.value)


def test_mesh_sharding_misuse():
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    with pytest.raises(TypeError, match="takes mesh= and spec= together"):
        spmdsim.show.sharding(np.zeros(8), mesh=mesh)
    with pytest.raises(TypeError, match="in_axes/axis_size are pmap's"):
        spmdsim.show.sharding(np.zeros(8), 1, mesh=mesh, spec=spmdsim.P("x"))
    with pytest.raises(ValueError, match=r"inside a mapped function, show every device's block with spmdsim.show.bl"):
        spmdsim.pmap(lambda b: spmdsim.show.sharding(b, mesh=mesh, spec=spmdsim.P()) and b, "i")(np.zeros(2))
    with pytest.raises(ValueError, match=r"x of shape \(0, 4\) has no elements"):
        spmdsim.show.sharding(np.zeros((0, 4)), mesh=mesh, spec=spmdsim.P("x"))
    pic = spmdsim.show.sharding(np.float32(3.5), mesh=mesh, spec=spmdsim.P(), echo=False)    # a scalar: one cell
    assert "device 7 [x=3, y=1]  x      ()           3.5" in pic.text and len(cells(parse(pic)[0])) == 1 + 8


def run_blocks(axis_name, echo=False):
    """show.blocks(b, axis_name) on every device of a (4, 2) mesh, x = arange(32).reshape(8, 4) laid out by
    P('x', 'y'): the pictures, by device."""
    pictures = {}

    def f(b):
        pictures[int(lax.axis_index(("x", "y")))] = spmdsim.show.blocks(b, axis_name, echo=echo)
        return b

    mesh, spec = spmdsim.make_mesh((4, 2), ("x", "y")), spmdsim.P("x", "y")
    spmdsim.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec)(np.arange(32).reshape(8, 4))
    return pictures


def test_blocks_inside_shard_map_shows_every_devices_block_printed_once(capsys):
    x = np.arange(32).reshape(8, 4)
    pictures = run_blocks(("x", "y"), echo=True)
    printed = capsys.readouterr().out
    assert {line.split(" | ")[0] for line in printed.splitlines()} == {"device 0 [x=0, y=0]"}   # once, by device 0
    assert len({p.text for p in pictures.values()}) == 1 and len({p.svg for p in pictures.values()}) == 1
    text = pictures[3].text
    assert text.startswith("x: the blocks of the 8 devices along 'x', 'y'\n")
    for d, line in table_rows(text).items():
        i, j = divmod(d, 2)
        assert numbers(line.split("(2, 2)")[1]) == x[2 * i:2 * i + 2, 2 * j:2 * j + 2].ravel().tolist()
    root, width = parse(pictures[0])
    assert_every_text_fits(root, width)
    assert legend(root) == [f"device {d} [x={d // 2}, y={d % 2}]" for d in range(8)]
    heads = {t.text: (float(t.get("x")), float(t.get("y"))) for t in root.iter(SVG + "text")
             if t.text and t.text.startswith("device ") and t not in {t for _, t in cells(root)}}
    # the panels lie as the devices do in the mesh: x down, y across
    assert heads["device 4 [x=2, y=0]"][0] < heads["device 5 [x=2, y=1]"][0]
    assert heads["device 4 [x=2, y=0]"][1] == heads["device 5 [x=2, y=1]"][1] > heads["device 2 [x=1, y=0]"][1]
    fills = [rect.get("fill") for rect, _ in cells(root)]
    assert len(fills) == 32 and len(set(fills)) == 8


def test_blocks_over_one_axis_gives_each_group_its_picture(capsys):
    pictures = run_blocks("y", echo=True)
    printers = {line.split(" | ")[0] for line in capsys.readouterr().out.splitlines()}
    assert printers == {f"device {2 * i} [x={i}, y=0]" for i in range(4)}   # each group's coordinate 0
    assert pictures[3].text == pictures[2].text != pictures[1].text
    assert pictures[3].text.startswith("x: the blocks of the 2 devices along 'y', in the group x=1\n")
    assert sorted(table_rows(pictures[3].text)) == [2, 3]
    # names in another order: gathered in that order, labelled and drawn by mesh position all the same
    assert run_blocks(("y", "x"))[5].text.split("\n", 1)[1] == run_blocks(("x", "y"))[5].text.split("\n", 1)[1]


def test_blocks_is_a_collective():
    with pytest.raises(NameError, match="show.blocks is a collective: call it inside a function mapped"):
        spmdsim.show.blocks(np.zeros(3))
    with pytest.raises(NameError, match="show.blocks was called with axis_name='z'"):
        run_blocks("z")
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))

    def some_devices(b):
        if lax.axis_index("x") > 0:
            spmdsim.show.blocks(b, "x")
        return b

    with pytest.raises(spmdsim.CollectiveDeadlockError, match=r"never complete: device 0 \[x=0, y=0\] done without"):
        spmdsim.shard_map(some_devices, mesh=mesh, in_specs=spmdsim.P("x"), out_specs=spmdsim.P("x"))(np.zeros(8))
    with pytest.raises(spmdsim.CollectiveMismatchError, match="test_pictures.py"):
        spmdsim.shard_map(lambda b: spmdsim.show.blocks(b[:int(lax.axis_index("x")) + 1], "x") and b, mesh=mesh,
                          in_specs=spmdsim.P("x"), out_specs=spmdsim.P("x"))(np.zeros(8))


def test_blocks_under_pmap_with_many_devices_is_elided():
    pictures = {}

    def f(b):
        pictures[int(lax.axis_index("i"))] = spmdsim.show.blocks(b, "i", echo=False)
        return b

    with spmdsim.set_device_count(16):
        spmdsim.pmap(f, axis_name="i")(np.arange(16 * 40.0).reshape(16, 40))
    root, width = parse(pictures[7])
    assert width <= 1400 and len(cells(root)) == 6 * 9      # devices 0, 1, 2, …, 13, 14, 15; 4 + … + 4 cells
    assert legend(root) == [f"device {d} [i={d}]" for d in (0, 1, 2, 13, 14, 15)]
    assert_every_text_fits(root, width)
    assert len(re.findall(r"^device \d+ \[i=\d+\]", pictures[7].text, re.MULTILINE)) == 16     # the table: every device


def test_mesh_collective_groups_and_values():
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    x = np.arange(16.0).reshape(8, 2)
    pic = spmdsim.show.collective("psum", x, mesh=mesh, spec=spmdsim.P("x", "y"), axis_name="x", echo=False)
    rows = table_rows(pic.text)
    order = [int(MESH_LABEL.match(line).group(1)) for line in pic.text.splitlines() if MESH_LABEL.match(line)]
    assert order == [0, 2, 4, 6, 1, 3, 5, 7]                # by group (y), then rank along x
    assert "2 communicator groups of 4 devices, the devices that differ only along 'x'" in pic.text
    for d, line in rows.items():
        i, j = divmod(d, 2)
        group, rank, *values = line.split("]", 1)[1].split()
        assert (group, rank) == (f"y={j}", str(i))
        total = sum(x[2 * k:2 * k + 2, j] for k in range(4))   # the blocks of column j, summed over x
        assert numbers(" ".join(values)) == [*x[2 * i:2 * i + 2, j], *total]
    root, width = parse(pic)
    assert_every_text_fits(root, width)
    assert legend(root)[-1] == "combined from every device of the group"
    brackets = [g for g in root.iter(SVG + "g") if g.get("class") == "group"]
    assert [g.find(SVG + "text").text for g in brackets] == ["y=0", "y=1"]
    row_y = {t.text.rsplit(", rank", 1)[0]: float(t.get("y")) for t in root.iter(SVG + "text")
             if t.text and MESH_LABEL.match(t.text) and t.text.endswith(tuple(f"rank {r}" for r in range(4)))}
    for g, members in zip(brackets, [(0, 2, 4, 6), (1, 3, 5, 7)]):
        top, bottom = (float(v) for v in re.findall(r"[\d.]+", g.find(SVG + "path").get("d"))[1:4:2])
        labels = [f"device {d} [x={d // 2}, y={d % 2}]" for d in members]
        assert all(top <= row_y[label] <= bottom for label in labels)


def test_mesh_collective_colours_data_by_the_device_it_came_from():
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    pic = spmdsim.show.collective("ppermute", np.arange(8.0), mesh=mesh, spec=spmdsim.P(("x", "y")), axis_name="x",
                                  perm=[(0, 1), (1, 2), (2, 3)], echo=False)
    root, width = parse(pic)
    swatch = {g.find(SVG + "text").text: g.find(SVG + "rect").get("fill") for g in root.iter(SVG + "g")
              if g.get("class") == "legend"}
    fills = [rect.get("fill") for rect, _ in cells(root)]    # rows 0, 2, 4, 6, 1, 3, 5, 7: before, after
    rows = [0, 2, 4, 6, 1, 3, 5, 7]
    after = dict(zip(rows, fills[1::2]))
    assert after[0] == after[1] == swatch["zeros (received nothing)"]    # rank 0 of each group receives nothing
    assert after[2] == swatch["device 0 [x=0, y=0]"] and after[7] == swatch["device 5 [x=2, y=1]"]
    assert dict(zip(rows, fills[0::2]))[5] == swatch["device 5 [x=2, y=1]"]
    assert_every_text_fits(root, width)
    assert re.search(r"device 7 \[x=3, y=1\]  y=1\s+3\s+\[7\.\]\s+\[5\.\]", pic.text)
    # over a tuple of axes, ppermute ranks the devices in mesh order (as XLA), all_gather in the order named
    x = np.arange(1.0, 9.0)
    pic = spmdsim.show.collective("ppermute", x, mesh=mesh, spec=spmdsim.P(("x", "y")), axis_name=("y", "x"),
                                  perm=[(0, 1)], echo=False)
    assert re.search(r"device 1 \[x=0, y=1\]  all\s+1\s+\[2\.\]\s+\[1\.\]", pic.text)   # rank 1 got rank 0's
    pic = spmdsim.show.collective("all_gather", x, mesh=mesh, spec=spmdsim.P(("x", "y")), axis_name=("y", "x"),
                                  echo=False)
    assert re.search(r"device 2 \[x=1, y=0\]  all\s+1\s+\[3\.\]\s+\[\[1\.\], \[3\.\], \[5\.\]", pic.text)


def test_mesh_collective_of_large_blocks_is_bounded_and_checked():
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    x = np.random.default_rng(0).standard_normal((8, 400))
    widths = []
    for n in (400, 4000):
        x = np.random.default_rng(0).standard_normal((8, n))
        root, width = parse(spmdsim.show.collective("all_gather", x, mesh=mesh, spec=spmdsim.P("x", "y"),
                                                    axis_name="y", tiled=True, axis=1, echo=False))
        assert len(cells(root)) == 8 * (2 * 9 + 2 * 9)      # 8 rows, before and after 2 x (4 + … + 4) cells
        assert_every_text_fits(root, width)
        widths.append(width)
    assert widths[0] == widths[1] <= 1500
    with pytest.raises(NameError, match="psum was called with axis_name='q'"):
        spmdsim.show.collective("psum", x, mesh=mesh, spec=spmdsim.P("x"), axis_name="q")
    with pytest.raises(TypeError, match="mesh=, spec= and axis_name= together"):
        spmdsim.show.collective("psum", x, mesh=mesh, axis_name="x")
    with pytest.raises(ValueError, match="not divisible"):
        spmdsim.show.collective("psum", x[:6], mesh=mesh, spec=spmdsim.P("x"), axis_name="x")


def test_the_docs_mesh_example_runs_and_its_figure_is_current(capsys):
    root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root_dir, "docs", "shard_map_and_meshes.md")) as f:
        page = f.read()
    section = page[page.index("## Pictures of a mesh"):]
    start = section.index("```python\n") + len("```python\n")
    code = section[start:section.index("\n```", start)]
    exec(code, {"np": np, "spmdsim": spmdsim})
    printed = capsys.readouterr().out
    assert re.search(r"device 5 \[x=2, y=1\]\W+x\[2:3, 2:4\]", printed)        # plain or rich
    assert re.search(r"device 1 \[x=0, y=1\] \|.*device 7 \[x=3, y=1\]", printed)   # group y=1, printed by its x=0
    mesh = spmdsim.make_mesh((4, 2), ("x", "y"))
    drawn = spmdsim.show.collective("all_gather", np.arange(16).reshape(4, 4), mesh=mesh, spec=spmdsim.P("x", "y"),
                                    axis_name="x", axis=1, tiled=True, echo=False)
    with open(os.path.join(root_dir, "docs", "all_gather_mesh.svg")) as f:
        assert f.read() == drawn.svg, "python docs/make_figures.py redraws docs/all_gather_mesh.svg"


def test_sharding_refuses_a_mapped_axis_longer_than_the_devices_as_pmap_does():
    x = np.arange(24).reshape(2, 12)
    with spmdsim.set_device_count(8):
        with pytest.raises(ValueError) as by_pmap:
            spmdsim.pmap(lambda b: b, in_axes=1)(x)
        with pytest.raises(type(by_pmap.value)) as by_show:
            spmdsim.show.sharding(x, in_axes=1, echo=False)
        assert str(by_show.value) == str(by_pmap.value)
        assert "the mapped axis has size 12, but only 8 virtual devices are available" in str(by_show.value)
        assert len(spmdsim.show.sharding(x, in_axes=0, echo=False).text.splitlines()) > 2   # 2 blocks: drawn
