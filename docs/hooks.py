"""mkdocs hooks (``hooks:`` in mkdocs.yml) for the tutorial notebooks' pages: a link from one notebook to another
names the notebook (``2_in_axes_out_axes.ipynb``, which works in Jupyter), and on the site points to that
notebook's page; each page starts with a link to download its notebook (mkdocs-jupyter's ``include_source``
puts the file beside the page)."""
import posixpath
import re

_NOTEBOOK_LINK = re.compile(r'href="([^":#]+\.ipynb)(#[^"]*)?"')


def on_page_content(html, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return html

    def to_page(match):
        target = files.get_file_from_path(posixpath.normpath(posixpath.join(posixpath.dirname(page.file.src_uri),
                                                                            match[1])))
        if target is None:
            return match[0]
        return f'href="{target.url_relative_to(page.file)}{match[2] or ""}"'

    name = posixpath.basename(page.file.src_uri)
    download = (f'<p class="notebook-download"><a href="{name}" download>Download {name}</a> to run it in Jupyter '
                f'(Getting started says how).</p>\n')
    return download + _NOTEBOOK_LINK.sub(to_page, html)
