"""The slide decks and the static site, as an instructor and a reader see them, with no network.

The session builds them first (scripts/build_slides.py and scripts/build_site.py, as `make html`
does) from the notebooks as they are now, and serves _site/ on 127.0.0.1. Each deck is stepped
through with the keyboard from its first slide to its last; every slide must be reached and
visible. Pages must typeset their maths, decode their plots and draw their saved widgets. Any
request to another machine is aborted and fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from facts import NOTEBOOKS, notebook_facts

pytestmark = pytest.mark.slow  # drives a browser: `make test-browser`, never `make check`

# Where the deck is: which leaf <section> is shown, and how many fragments of it are visible.
STATE_JS = """() => {
  const leaves = [...document.querySelectorAll('.reveal .slides section')].filter(s => !s.querySelector('section'));
  const current = leaves.findIndex(s => s.classList.contains('present'));
  const shown = current >= 0 ? leaves[current].querySelectorAll('.fragment.visible').length : -1;
  return {current, shown, leaves: leaves.length};
}"""
SLIDE_SHOWN_JS = """() => {
  const leaves = [...document.querySelectorAll('.reveal .slides section')].filter(s => !s.querySelector('section'));
  const s = leaves.find(s => s.classList.contains('present'));
  if (!s) return 'no slide is shown';
  const box = s.getBoundingClientRect();
  if (box.width < 100 || box.height < 20) return `the slide is ${box.width}x${box.height} px`;
  if (getComputedStyle(s).display === 'none' || getComputedStyle(s).visibility === 'hidden') return 'the slide is hidden';
  if (!s.innerText.trim() && !s.querySelector('img, svg, .jupyter-widgets')) return 'the slide is empty';
  return '';
}"""
IMAGES_JS = """() => [...document.querySelectorAll('img')].filter(i => !(i.complete && i.naturalWidth > 0))
  .map(i => i.src.slice(0, 60))"""
MATHJAX_DONE_JS = """() => window.MathJax && MathJax.Hub && MathJax.isReady &&
  MathJax.Hub.queue.pending === 0 && !MathJax.Hub.queue.running"""
MATH_JS = """() => ({typeset: document.querySelectorAll('.MathJax_CHTML, .MathJax_Preview + .MathJax_CHTML, mjx-container').length,
  errors: document.querySelectorAll('.MathJax_Error, merror').length + (document.body.innerText.includes('Math Processing Error') ? 1 : 0)})"""
WIDGETS_JS = """() => [...document.querySelectorAll('.jupyter-widgets')]
  .filter(w => !w.parentElement.closest('.jupyter-widgets')).length"""


def check_page_content(page, facts, where: str) -> None:
    broken = page.evaluate(IMAGES_JS)
    assert not broken, f"{where}: images that did not decode: {broken}"
    if facts.images:
        n = page.evaluate("() => document.querySelectorAll('.jp-OutputArea-output img').length")
        assert n >= facts.images, f"{where}: {n} plot images, the notebook has {facts.images}"
    if facts.has_math:
        page.wait_for_function(MATHJAX_DONE_JS, timeout=30_000)
        math = page.evaluate(MATH_JS)
        assert math["typeset"] > 0, f"{where}: the notebook has maths but MathJax typeset none"
        assert not math["errors"], f"{where}: MathJax reported {math['errors']} errors"
    if facts.widget_views:
        page.wait_for_function(f"() => ({WIDGETS_JS})() >= {facts.widget_views}", timeout=30_000)
        text = page.evaluate("() => document.body.innerText")
        assert "Error displaying widget" not in text, f"{where}: a saved widget failed to render"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_slide_deck_steps_through_offline(site, site_url: str, offline_page, path: Path) -> None:
    facts = notebook_facts(site / "notebooks" / path.name)  # the copy the site was built from
    page = offline_page.page
    page.goto(f"{site_url}/slides/{path.stem}.slides.html")
    page.wait_for_selector(".reveal.ready", timeout=30_000)
    state = page.evaluate(STATE_JS)
    assert state["leaves"] == facts.slides, (
        f"the deck has {state['leaves']} slides, the notebook's metadata makes {facts.slides}"
    )
    assert state["current"] == 0, "the deck does not open on its first slide"
    visited = {0}
    page.locator(".reveal").click(position={"x": 5, "y": 5})  # keyboard focus on the deck
    presses, stuck = 0, 0
    limit = facts.slides + facts.fragments + 10
    while stuck < 2:
        page.keyboard.press("Space")  # reveal.js "next": fragments, then vertical slides, then the next one
        presses += 1
        assert presses <= limit, f"{presses} key presses and the deck has not ended ({facts.slides} slides)"
        new = page.evaluate(STATE_JS)
        stuck = stuck + 1 if new == state else 0
        state = new
        if state["current"] not in visited:
            visited.add(state["current"])
            problem = page.evaluate(SLIDE_SHOWN_JS)
            assert not problem, f"slide {state['current'] + 1} of {state['leaves']}: {problem}"
    assert state["current"] == state["leaves"] - 1, "stepping stopped before the last slide"
    assert visited == set(range(state["leaves"])), (
        f"slides never reached: {sorted(set(range(state['leaves'])) - visited)}"
    )
    check_page_content(page, facts, f"deck {path.stem}")
    assert not offline_page.page_errors, f"JavaScript errors: {offline_page.page_errors}"
    offline_page.assert_offline()


def test_site_index_lists_the_course_in_order(site, site_url: str, offline_page) -> None:
    page = offline_page.page
    page.goto(f"{site_url}/index.html")
    ids = page.eval_on_selector_all("ol.course > li", "items => items.map(li => li.id)")
    built_from = sorted(p.stem for p in (site / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert ids == built_from, "the index must list every notebook, in course order"
    assert {p.stem for p in NOTEBOOKS} <= set(ids), "a course notebook is missing from the site"
    listed = page.inner_text("ol.course")  # markdown kept: code spans with their underscores, no raw maths
    assert "requires_grad" in listed and "grad_fn" in listed and "$" not in listed, listed[:300]
    links = page.eval_on_selector_all("ol.course a", "links => links.map(a => a.href)")
    for href in links:
        response = page.request.get(href)
        assert response.ok, f"the index links {href}, which answers {response.status}"
    offline_page.assert_offline()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_site_page_renders_offline(site, site_url: str, offline_page, path: Path) -> None:
    facts = notebook_facts(site / "notebooks" / path.name)  # the copy the site was built from
    page = offline_page.page
    page.goto(f"{site_url}/notebooks/{path.stem}.html")
    page.wait_for_load_state("load")
    cells = page.locator(".jp-Cell").count()
    assert cells >= facts.code_cells, f"the page shows {cells} cells"
    check_page_content(page, facts, f"page {path.stem}")
    assert not offline_page.page_errors, f"JavaScript errors: {offline_page.page_errors}"
    offline_page.assert_offline()
