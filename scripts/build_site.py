"""Build the static, offline HTML version of the whole course: ``make html``.

    python scripts/build_site.py

Writes ``_site/index.html`` (every notebook in course order, with what it teaches and links to its
page, its slide deck and the .ipynb) and ``_site/notebooks/NN_x.html`` (the executed notebook with
its committed outputs: plots, maths typeset by MathJax, and widgets drawn from their saved state by
the ipywidgets HTML manager). Pages load only ``_site/assets/`` (copied from the pinned npm packages,
see scripts/build_slides.py), so the folder works with no network, opened from disk or served with
``python -m http.server -d _site``.
"""

from __future__ import annotations

import html
import shutil
from pathlib import Path

import nbformat

from course_lib.manifest import course
from course_tools.build_slides import (
    ROOT,
    SITE,
    TEMPLATES,
    check_no_mermaid,
    check_offline,
    copy_assets,
    exporter_urls,
)

COURSE_TITLE = "PyTorch training internals, from the Tensor to multi-node DDP"


def summary_html(markdown: str) -> str:
    """A manifest summary (one line, `code` spans) as safe HTML: escaped text, code spans as <code>."""
    parts = markdown.split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def build_page(path: Path, nb: nbformat.NotebookNode, out_dir: Path, nav: list[tuple[str, str]]) -> Path:
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    config = Config()
    config.HTMLExporter.update(exporter_urls())
    config.HTMLExporter.embed_images = True
    exporter = HTMLExporter(config=config, template_name="course_lab", extra_template_basedirs=[str(TEMPLATES)])
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": path.stem}, "course_nav": nav})
    out = out_dir / f"{path.stem}.html"
    out.write_text(body, encoding="utf-8")
    check_offline(out)
    return out


INDEX = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 52em; margin: 2em auto;
       padding: 0 1em; line-height: 1.5; color: #222; }}
ol.course {{ padding-left: 0; list-style: none; }}
ol.course li {{ margin: 0 0 1.2em 0; }}
ol.course .name {{ font-weight: 600; font-size: 1.1em; }}
ol.course .links a {{ margin-right: 1em; font-size: 0.9em; }}
ol.course .summary {{ margin: 0.2em 0; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p>The course as static pages, in order. Every page shows the notebook as committed, outputs included;
to run the code, open the notebooks in JupyterLab (<code>make lab</code>). The slide decks step with the
arrow keys or the space bar. Everything here works offline.</p>
<ol class="course">
{items}
</ol>
</body>
</html>
"""


def main() -> int:
    entries = course()
    paths = [n.path for n in entries]
    copy_assets()
    out_dir = SITE / "notebooks"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    items = []
    for i, path in enumerate(paths):
        nb = nbformat.read(path, as_version=4)
        check_no_mermaid(nb, path)
        nav = [("Course index", "../index.html")]
        if i > 0:
            nav.append((f"← {paths[i - 1].stem}", f"{paths[i - 1].stem}.html"))
        if i + 1 < len(paths):
            nav.append((f"{paths[i + 1].stem} →", f"{paths[i + 1].stem}.html"))
        nav.append(("Slides", f"../slides/{path.stem}.slides.html"))
        page = build_page(path, nb, out_dir, nav)
        shutil.copy2(path, out_dir / path.name)
        title = f"{entries[i].number} · {entries[i].title}"
        items.append(
            f'<li id="{path.stem}"><div class="name"><a href="notebooks/{page.name}">{summary_html(title)}</a></div>'
            f'<div class="summary">{summary_html(entries[i].summary)}</div>'
            f'<div class="links"><a href="notebooks/{page.name}">page</a>'
            f'<a href="slides/{path.stem}.slides.html">slides</a>'
            f'<a href="notebooks/{path.name}" download>notebook (.ipynb)</a></div></li>'
        )
        print(f"{page.relative_to(ROOT)}")
    index = SITE / "index.html"
    index.write_text(INDEX.format(title=html.escape(COURSE_TITLE), items="\n".join(items)), encoding="utf-8")
    check_offline(index)
    slides_missing = [p.stem for p in paths if not (SITE / "slides" / f"{p.stem}.slides.html").exists()]
    print(f"{index.relative_to(ROOT)}: {len(paths)} notebooks in course order")
    if slides_missing:
        print(f"note: the index links slide decks; build them with `make slides` ({len(slides_missing)} missing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
