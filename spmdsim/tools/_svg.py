"""SVG drawing without a plotting library: device colours, text sized to fit, and :class:`Picture`, the
object the teaching pictures and the timeline return (printed as text, shown inline by Jupyter)."""
from __future__ import annotations

import colorsys
import html

__all__ = ["Picture", "device_colour", "text_width", "GREY", "FONT_SIZE", "CHAR_EM"]

FONT_SIZE = 12
CHAR_EM = 0.62  # advance of a monospace character in em (0.6 in DejaVu Sans Mono and Courier), with a margin
GREY = "#bbbbbb"
_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
            "#17becf"]


def text_width(text: str, font_size: float = FONT_SIZE) -> float:
    """Width in pixels of ``text`` in the pictures' monospace font."""
    return len(text) * CHAR_EM * font_size


def device_colour(device: int, n_devices: int) -> str:
    """A distinct colour per device: a fixed palette up to 10 devices, hues around the circle beyond."""
    if device < 0:
        return GREY
    if n_devices <= len(_PALETTE):
        return _PALETTE[device]
    r, g, b = colorsys.hls_to_rgb(device / n_devices, 0.55, 0.6)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def text(x: float, y: float, content: str, *, size: int = FONT_SIZE, anchor: str = "start", extra: str = "") -> str:
    """An SVG ``<text>`` element (``content`` escaped)."""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f'{html.escape(content)}</text>')


def document(width: float, height: float, body: list[str]) -> str:
    """A whole SVG document: white background, monospace font."""
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
                      f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace">',
                      '<rect width="100%" height="100%" fill="white"/>', *body, "</svg>"])


class Picture:
    """A picture and its text: ``print(picture)`` shows the text table, Jupyter shows the drawing inline.

    Attributes:
        text: the table as plain text.
        svg: the drawing as an SVG document.
    """

    def __init__(self, text: str, svg: str):
        self.text, self.svg = text, svg

    def save(self, path) -> None:
        """Write the SVG document to ``path``."""
        with open(path, "w") as f:
            f.write(self.svg)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        first = self.text.split("\n", 1)[0]
        return f"<Picture: {first}; .text, .svg, .save(path)>"

    def _repr_svg_(self) -> str:
        return self.svg

    def _repr_html_(self) -> str:
        return f'<div style="overflow-x: auto">{self.svg}</div>'
