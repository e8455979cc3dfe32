"""Build one reveal.js slide deck per notebook, working offline: ``make slides``.

    python scripts/build_slides.py [notebooks/NN_x.ipynb ...]     # default: every course notebook

Each deck is ``_site/slides/NN_x.slides.html``, cut into slides by each cell's
``metadata.slideshow.slide_type``. Nothing is fetched from the network when a deck is shown:
reveal.js 4.x, require.js, jQuery, MathJax 2.7 and the ipywidgets HTML manager are copied from
``node_modules/`` (installed from the pinned ``package.json``/``package-lock.json`` by ``npm ci``)
into ``_site/assets/``, and nbconvert is pointed at them with relative URLs. Two nbconvert defaults
would still reach the internet and are replaced: the reveal template imports a mermaid script from a
CDN on every page (overridden in ``templates/course_reveal``), and most reveal.js themes import web
fonts (the ``white`` theme used here ships its font in reveal.js itself). Each written page is then
scanned, and the build fails if it still loads anything from another machine.

This module also holds what ``scripts/build_site.py`` shares with it (assets, templates, checks).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NODE_MODULES = ROOT / "node_modules"
TEMPLATES = ROOT / "templates"
SITE = ROOT / "_site"
ASSETS = SITE / "assets"

# Relative to a page one folder below _site/ (_site/slides/*.html and _site/notebooks/*.html).
ASSET_URL = "../assets"
REVEAL_THEME = "white"  # its font (Source Sans Pro) ships with reveal.js; simple/sky/... import Google Fonts

# What each npm package contributes to _site/assets/<name>/ (paths inside the package).
ASSET_FILES: dict[str, tuple[str, list[str]]] = {
    "reveal.js": ("reveal.js", ["dist", "plugin/notes", "LICENSE"]),
    "requirejs": ("requirejs", ["require.js"]),
    "jquery": ("jquery", ["dist/jquery.min.js", "LICENSE.txt"]),
    "mathjax": (
        "mathjax",
        [
            "MathJax.js",
            "config/TeX-AMS_CHTML-full.js",
            "config/Safe.js",
            "extensions",
            "jax/input/TeX",
            "jax/output/CommonHTML",
            "jax/output/PreviewHTML",
            "jax/element",
            "fonts/HTML-CSS/TeX/woff",
            "fonts/HTML-CSS/TeX/otf",
            "localization/en",
            "LICENSE",
        ],
    ),
    "@jupyter-widgets/html-manager": ("html-manager", ["dist", "package.json"]),
}


def exporter_urls() -> dict[str, str]:
    """The nbconvert settings that point every script a page loads at ``_site/assets/``."""
    return {
        "require_js_url": f"{ASSET_URL}/requirejs/require.js",
        "jquery_url": f"{ASSET_URL}/jquery/dist/jquery.min.js",
        # MathJax.js with an explicit config: latest.js would ask a CDN for a newer version.
        "mathjax_url": f"{ASSET_URL}/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
        "widget_renderer_url": f"{ASSET_URL}/html-manager/dist/embed-amd.js",
    }


def course_notebooks() -> list[Path]:
    """Every course notebook, in course order (the NN_ prefix)."""
    from course_lib.manifest import notebook_paths

    return notebook_paths()


def pinned_versions() -> dict[str, str]:
    """The exact version package-lock.json records for each asset package."""
    lock = json.loads((ROOT / "package-lock.json").read_text())
    return {name: lock["packages"][f"node_modules/{name}"]["version"] for name in ASSET_FILES}


def check_node_modules() -> None:
    """Fail with the fix if node_modules/ is missing or holds other versions than the lock."""
    for name, want in pinned_versions().items():
        meta = NODE_MODULES / name / "package.json"
        if not meta.exists():
            sys.exit(f"error: {meta.relative_to(ROOT)} is missing; run `npm ci` in {ROOT} first")
        have = json.loads(meta.read_text())["version"]
        if have != want:
            sys.exit(f"error: node_modules has {name} {have} but package-lock.json pins {want}; run `npm ci`")


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.map", "*.ts"))
    else:
        shutil.copy2(src, dst)


def copy_assets() -> None:
    """Copy the pinned browser libraries from node_modules/ into _site/assets/ (idempotent)."""
    check_node_modules()
    stamp = ASSETS / "versions.json"
    versions = pinned_versions()
    if stamp.exists() and json.loads(stamp.read_text()) == versions:
        return
    shutil.rmtree(ASSETS, ignore_errors=True)
    for name, (folder, parts) in ASSET_FILES.items():
        for part in parts:
            _copy(NODE_MODULES / name / part, ASSETS / folder / part)
    stamp.write_text(json.dumps(versions, indent=1, sort_keys=True) + "\n")


def check_no_mermaid(nb: nbformat.NotebookNode, path: Path) -> None:
    """Mermaid diagrams would need mermaid.js from a CDN; the offline templates leave it out."""
    for cell in nb.cells:
        in_markdown = cell.cell_type == "markdown" and "```mermaid" in cell.source
        in_output = any("text/vnd.mermaid" in out.get("data", {}) for out in cell.get("outputs", []))
        if in_markdown or in_output:
            sys.exit(f"error: {path.name} has a mermaid diagram, which cannot render offline; use an image")


# A resource the browser fetches by itself: script/img/iframe src, stylesheet href, CSS @import/url(),
# an ES module import. Plain <a href> links are not fetched, so references to papers are fine.
_FETCHED = re.compile(
    r"""(?:<(?:script|img|iframe|source|audio|video)\b[^>]*?\bsrc\s*=\s*["']?"""
    r"""|<link\b[^>]*?\bhref\s*=\s*["']?"""
    r"""|@import\s+(?:url\()?\s*["']?"""
    r"""|\burl\(\s*["']?"""
    r"""|\bimport\s*\(?\s*["'])"""
    r"""(?P<url>(?:https?:)?//[^"')\s>]+)""",
    re.I,
)


def remote_fetches(html: str) -> list[str]:
    """The URLs on other machines that a page would fetch when opened."""
    return sorted({m.group("url") for m in _FETCHED.finditer(html)})


def check_offline(page: Path) -> None:
    remote = remote_fetches(page.read_text(encoding="utf-8"))
    if remote:
        sys.exit(f"error: {page.relative_to(ROOT)} would fetch from the network: {', '.join(remote)}")


def build_deck(path: Path, out_dir: Path) -> Path:
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    nb = nbformat.read(path, as_version=4)
    check_no_mermaid(nb, path)
    config = Config()
    config.SlidesExporter.update(exporter_urls())
    config.SlidesExporter.reveal_url_prefix = f"{ASSET_URL}/reveal.js"
    config.SlidesExporter.reveal_theme = REVEAL_THEME
    config.SlidesExporter.reveal_scroll = True  # long code cells scroll instead of running off the slide
    config.SlidesExporter.embed_images = True
    exporter = SlidesExporter(config=config, template_name="course_reveal", extra_template_basedirs=[str(TEMPLATES)])
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": path.stem}})
    out = out_dir / f"{path.stem}.slides.html"
    out.write_text(body, encoding="utf-8")
    check_offline(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook of the course (course.toml)")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or course_notebooks()
    copy_assets()
    out_dir = SITE / "slides"
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in paths:
        out = build_deck(path, out_dir)
        n = sum(
            1
            for c in nbformat.read(path, as_version=4).cells
            if c.metadata.get("slideshow", {}).get("slide_type") in ("slide", "subslide")
        )
        print(f"{out.relative_to(ROOT)}: {n} slides")
    print("open _site/slides/<name>.slides.html in a browser (offline; arrows or space to step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
