"""Every notebook, as a learner sees it in JupyterLab, in a real browser.

For each notebook: open it in the session's JupyterLab and check what the learner sees: no error
output, every plot drawn as an image that decodes. nbval has already run every cell of every
notebook in a kernel, so running them all again here would only repeat that work; what a browser
adds is live widgets. So for each notebook with an explorer (a slider, a dropdown, ...), and for one
notebook with progress bars (every bar is the same tqdm widget), a copy that holds only the widget
cells and the cells they need (by name, ``course_tools.gpu_cells.needed_cells``) is cleared and run
here: every widget must be drawn live (not as its text fallback) and moving a control must change
the output it drives.
The page may not reach other machines.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import nbformat
import pytest
from facts import NOTEBOOKS, WIDGET_VIEW, NotebookFacts, notebook_facts

from course_tools.gpu_cells import needed_cells

pytestmark = pytest.mark.slow  # drives a browser: `make test-browser`, never `make check`

RUN_TIMEOUT_S = 240  # one notebook, all cells; the course's target is < 40 s on 2 cores

OUTPUT = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output"

# A cell that raised: JupyterLab 4 shows the traceback as an output whose mime type is "error" or,
# as ipykernel's error outputs render, "stderr"; either way its text has the traceback header.
RAISED_JS = """sel => [...document.querySelectorAll(sel)].filter(o =>
  o.dataset.mimeType === 'application/vnd.jupyter.error' ||
  (o.dataset.mimeType === 'application/vnd.jupyter.stderr' && /Traceback/.test(o.innerText))
).map(o => o.innerText.slice(-3000))"""

# Done: no cell queued or running, the kernel idle, and every code cell numbered, or a cell raised
# (JupyterLab then stops, leaving the rest unnumbered).
DONE_JS = """([expected, sel]) => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return false;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim());
  if (prompts.some(t => t.includes('*'))) return false;
  if (!document.querySelector(".jp-Notebook-ExecutionIndicator[data-status='idle']")) return false;
  const numbered = prompts.filter(t => /^\\[\\d+\\]:?$/.test(t)).length;
  return numbered >= expected || [...document.querySelectorAll(sel)].some(o =>
    o.dataset.mimeType === 'application/vnd.jupyter.error' || /Traceback/.test(o.innerText));
}"""

IMAGES_JS = """sel => [...document.querySelectorAll(sel + ' img')].map(
  img => ({src: img.src.slice(0, 40), ok: img.complete && img.naturalWidth > 0}))"""

# Live widget views at the top of an output (those nested in another widget are its children).
WIDGET_JS = """sel => [...document.querySelectorAll(sel + ' > .jupyter-widgets')]
  .filter(w => !w.parentElement.closest('.jupyter-widgets')).length"""
# A widget output that failed to load shows its text/plain fallback, e.g. "IntSlider(value=3)".
WIDGET_FALLBACK = re.compile(
    r"^(?:interactive|[A-Z][A-Za-z]*(?:Box|Slider|Progress|Output|Dropdown|Button|Buttons|Text|"
    r"Checkbox|Label|HTML|Select|Widget))\("
)
FALLBACK_MESSAGES = ("Error displaying widget", "Loading widget...", "model not found")


# What a cell shows, minus the controls themselves (a slider's readout changes when it moves).
FINGERPRINT_JS = """cell => {
  const area = cell.querySelector('.jp-Cell-outputArea') || cell;
  const clone = area.cloneNode(true);
  clone.querySelectorAll('.widget-readout, .widget-slider, .widget-hslider, select, input, button,'
                         + ' .widget-dropdown, .widget-radio, .widget-toggle-buttons, .widget-checkbox')
       .forEach(e => e.remove());
  const images = [...area.querySelectorAll('img')].map(i => i.src).join('|');
  const canvases = [...area.querySelectorAll('canvas')].map(c => { try { return c.toDataURL(); } catch (e) { return ''; } }).join('|');
  return clone.textContent + '#' + images + '#' + canvases;
}"""

CONTROLS = [  # (selector, how to move it), tried in this order
    (f"{OUTPUT} .widget-hslider .noUi-handle, {OUTPUT} .widget-slider .noUi-handle", "drag"),
    (f"{OUTPUT} .widget-dropdown select", "select"),
    (f"{OUTPUT} .widget-toggle-buttons button:not(.mod-active)", "click"),
    (f"{OUTPUT} .widget-radio-box input:not(:checked)", "click"),
    (f"{OUTPUT} .widget-checkbox input", "click"),
    (f"{OUTPUT} .widget-toggle-button", "click"),
    (f"{OUTPUT} .widget-text input", "type"),  # a number box: type another number, then Enter
]


def open_notebook(page, lab, name: str, workspace: str, kernel: bool = True) -> None:
    """Open a notebook and wait until its cells are drawn and (``kernel``) its kernel is idle and connected.
    Without ``kernel`` the check reads only committed outputs: JupyterLab starts the kernel anyway, unwaited."""
    page.goto(lab.url(name, workspace))
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=90_000)
    if not kernel:
        return
    # The execution indicator says "idle" before any kernel exists: wait for the server to report
    # this notebook's kernel started, idle and connected to the page, then for the page to agree.
    deadline = time.monotonic() + 90
    while not any(
        s["path"] == name and s["kernel"]["execution_state"] == "idle" and s["kernel"]["connections"]
        for s in json.loads(lab.api("/api/sessions"))
    ):
        assert time.monotonic() < deadline, f"{name}: its kernel did not start within 90 s"
        page.wait_for_timeout(300)  # not time.sleep: Playwright serves the page's routed requests only while waiting
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=30_000)


def menu_command(page, menu: str, command: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.locator(f"li[data-command='{command}']").click()


def run_all(page, facts: NotebookFacts) -> float:
    """Clear every output, run all cells, wait until they are done; returns the seconds it took."""
    menu_command(page, "Edit", "editmenu:clear-all")
    page.wait_for_function(f"() => !document.querySelector(`{OUTPUT}`)", timeout=30_000)
    start = time.monotonic()
    menu_command(page, "Run", "runmenu:run-all")
    page.wait_for_function(DONE_JS, arg=[facts.code_cells, OUTPUT], timeout=RUN_TIMEOUT_S * 1000, polling=250)
    return time.monotonic() - start


def check_outputs(offline, facts: NotebookFacts) -> None:
    page = offline.page
    errors = page.evaluate(RAISED_JS, OUTPUT)
    assert not errors, f"{facts.name}: a cell raised in JupyterLab:\n" + "\n---\n".join(errors)
    prompts = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt").all_inner_texts()
    numbered = sum(1 for t in prompts if t.strip().strip(":").strip("[]").isdigit())
    assert numbered >= facts.code_cells, f"{facts.name}: only {numbered} of {facts.code_cells} code cells ran"

    images = page.evaluate(IMAGES_JS, OUTPUT)
    broken = [i["src"] for i in images if not i["ok"]]
    assert not broken, f"{facts.name}: images that did not decode: {broken}"
    assert len(images) >= facts.images, (
        f"{facts.name}: {len(images)} plots drawn as images in JupyterLab, the committed notebook has {facts.images}"
    )
    texts = page.locator(OUTPUT).all_inner_texts()
    fallback = [t for t in texts if t.startswith("<Figure size")]
    assert not fallback, f"{facts.name}: a plot was shown as text, not an image: {fallback[:3]}"

    live = page.evaluate(WIDGET_JS, OUTPUT)
    fallback = [t[:200] for t in texts if WIDGET_FALLBACK.match(t) or any(m in t for m in FALLBACK_MESSAGES)]
    assert not fallback, f"{facts.name}: widgets shown as their text fallback, not live: {fallback}"
    assert live >= facts.widget_views, (
        f"{facts.name}: {live} live widgets in JupyterLab, the committed notebook shows {facts.widget_views}"
    )
    offline.assert_offline(complete=False)


def fingerprint(cell) -> str:
    return hashlib.sha256(cell.evaluate(FINGERPRINT_JS).encode()).hexdigest()


def move_one_control(page, name: str) -> str:
    """Move the first control found (a slider is dragged); return what was moved. Fails if the
    output of the control's cell does not change within 20 s."""
    for selector, how in CONTROLS:
        control = page.locator(selector).first
        if control.count() == 0:
            continue
        control.scroll_into_view_if_needed()
        cell = control.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' jp-CodeCell ')][1]")
        before = fingerprint(cell)
        if how == "drag":
            track = control.locator("xpath=ancestor::div[contains(@class, 'noUi-target')][1]").bounding_box()
            handle = control.bounding_box()
            x0, y0 = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
            frac = 0.8 if x0 < track["x"] + track["width"] / 2 else 0.2
            page.mouse.move(x0, y0)
            page.mouse.down()
            page.mouse.move(track["x"] + frac * track["width"], y0, steps=8)
            page.mouse.up()
        elif how == "select":
            options = control.locator("option").all_inner_texts()
            current = control.evaluate("s => s.options[s.selectedIndex] ? s.options[s.selectedIndex].text : ''")
            others = [o for o in options if o != current]
            assert others, f"{name}: a dropdown with one option cannot be moved"
            control.select_option(label=others[-1])
        elif how == "type":
            current = control.input_value()
            try:
                new = "0.7" if float(current) != 0.7 else "0.3"
            except ValueError:
                continue  # free text: no generic value is known to be valid
            control.fill(new)
            control.press("Enter")
        else:
            control.click()
        deadline = time.monotonic() + 20
        while fingerprint(cell) == before:
            assert time.monotonic() < deadline, (
                f"{name}: moved a control ({how} {selector.split(',')[0].rsplit(' ', 1)[-1]}) "
                "but its cell's output did not change within 20 s"
            )
            page.wait_for_timeout(200)
        return f"{how} {selector.split(',')[0].rsplit(' ', 1)[-1]}"
    pytest.fail(f"{name}: its saved widget state has controls, but none was found on the page")


def check_saved_outputs(offline, facts: NotebookFacts) -> None:
    """The committed outputs of a notebook opened, not run: no error, every plot an image that decodes."""
    page = offline.page
    errors = page.evaluate(RAISED_JS, OUTPUT)
    assert not errors, f"{facts.name}: the committed notebook shows an error:\n" + "\n---\n".join(errors)
    page.wait_for_function(
        f"sel => document.querySelectorAll(sel + ' img').length >= {facts.images}", arg=OUTPUT, timeout=30_000
    )
    images = page.evaluate(IMAGES_JS, OUTPUT)
    broken = [i["src"] for i in images if not i["ok"]]
    assert not broken, f"{facts.name}: images that did not decode: {broken}"
    texts = page.locator(OUTPUT).all_inner_texts()
    fallback = [t for t in texts if t.startswith("<Figure size")]
    assert not fallback, f"{facts.name}: a plot was shown as text, not an image: {fallback[:3]}"
    offline.assert_offline(complete=False)


# The notebook whose progress bars are run live, for all: every bar in the course is the same tqdm widget,
# so one proves the front end draws them (without a kernel JupyterLab shows a saved bar as its text,
# which tests/test_static_rendering.py checks in every notebook).
BARS_RUN_LIVE_IN = "00_start_here"


def runs_in_lab(facts: NotebookFacts) -> bool:
    """Run all cells in the browser only where a live kernel shows what nbval cannot: each explorer's
    controls (every one is different), and the progress bars of one notebook."""
    if facts.widget_views == 0:
        return False
    return facts.controls > 0 or (facts.progress_bars > 0 and facts.name.startswith(BARS_RUN_LIVE_IN))


def widget_copy(path: Path) -> Path:
    """Beside ``path``, a copy holding only its widget cells and the code cells they need, in order, with their
    committed outputs (so :func:`notebook_facts` of the copy says what running it must show) and the notebook's
    metadata (its saved widget state). Markdown is left out: nothing runs there."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    targets = {i for i, c in enumerate(code) if any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", []))}
    keep = needed_cells([c.source for c in code], targets)
    nb.cells = [c for i, c in enumerate(code) if i in keep]
    copy = path.with_name(f"{path.stem}.widgets.ipynb")
    nbformat.write(nb, copy)
    return copy


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_in_jupyterlab(lab, offline_page, path: Path) -> None:
    facts = notebook_facts(lab.root / path.name)  # the copy the server runs
    page = offline_page.page
    open_notebook(page, lab, path.name, workspace=path.stem.replace("_", "-"), kernel=False)
    check_saved_outputs(offline_page, facts)
    if not runs_in_lab(facts):
        print(f"{path.name}: opened; its committed outputs render (nbval runs its cells)")
        return
    lab.shutdown_kernels()  # the whole notebook's kernel is not used: its widgets run in the copy
    copy = widget_copy(lab.root / path.name)
    live = notebook_facts(copy)
    assert live.widget_views == facts.widget_views, f"{path.name}: the copy lost a widget cell"
    open_notebook(page, lab, copy.name, workspace=f"{path.stem.replace('_', '-')}-widgets")
    seconds = run_all(page, live)
    print(
        f"{path.name}: ran the {live.code_cells} of {facts.code_cells} code cells its widgets need in JupyterLab"
        f" in ~{seconds:.1f} s"
    )
    check_outputs(offline_page, live)
    if live.controls:
        moved = move_one_control(page, path.name)
        print(f"{path.name}: {moved} changed the output")
        check_outputs(offline_page, live)


# A tiny notebook with an interactive plot: proves the control-moving check works (and can fail)
# whatever notebooks exist yet. It lives only in the test server's temporary copy.
PROBE_CELLS = [
    "import matplotlib.pyplot as plt\nimport ipywidgets as widgets",
    "def show(n):\n    plt.figure(figsize=(3, 2))\n    plt.plot(range(n), [i * i for i in range(n)])\n"
    "    plt.title(f'n = {n}')\n    plt.show()\n    print(f'n = {n}')\n\n"
    "widgets.interact(show, n=widgets.IntSlider(value=3, min=2, max=30));",
    "widgets.interact(lambda kind: print('kind =', kind), kind=widgets.Dropdown(options=['a', 'b', 'c']));",
]


def _write_probe(lab, name: str, sources) -> None:
    """A throw-away notebook of code cells in the test server's folder, for the harness self-checks."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [src if isinstance(src, dict) else nbformat.v4.new_code_cell(src) for src in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, lab.root / name)


def probe_facts(name: str, code_cells: int, images: int = 0, widget_views: int = 0, controls: int = 0) -> NotebookFacts:
    """What a harness probe notebook should show: a one-slide notebook of plain code cells."""
    return NotebookFacts(
        name=name,
        code_cells=code_cells,
        images=images,
        widget_views=widget_views,
        controls=controls,
        progress_bars=0,
        has_math=False,
        slides=1,
        fragments=0,
    )


def test_harness_moves_a_slider_and_sees_the_plot_change(lab, offline_page) -> None:
    _write_probe(lab, "widget_probe.ipynb", PROBE_CELLS)
    facts = probe_facts("widget_probe.ipynb", code_cells=3, images=1, widget_views=2, controls=2)
    page = offline_page.page
    open_notebook(page, lab, "widget_probe.ipynb", workspace="probe")
    run_all(page, facts)
    check_outputs(offline_page, facts)
    assert move_one_control(page, facts.name).startswith("drag")
    # The dropdown too: take the slider's cell out of the way by checking the select path directly.
    select = page.locator(f"{OUTPUT} .widget-dropdown select").first
    cell = select.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' jp-CodeCell ')][1]")
    before = fingerprint(cell)
    select.select_option(label="c")
    page.wait_for_timeout(200)
    deadline = time.monotonic() + 20
    while fingerprint(cell) == before:
        assert time.monotonic() < deadline, "choosing another dropdown option did not change its output"
        page.wait_for_timeout(200)
    check_outputs(offline_page, facts)


def test_rise_presents_a_notebook_as_live_slides(lab, offline_page) -> None:
    """RISE is installed and enabled in JupyterLab: View → Render as Reveal Slideshow shows the
    notebook as a reveal.js deck whose slides follow the cells' metadata and step with the keyboard."""
    path = NOTEBOOKS[0]
    facts = notebook_facts(lab.root / path.name)
    page = offline_page.page
    open_notebook(page, lab, path.name, workspace="rise")
    menu_command(page, "View", "RISE:preview")
    frame = page.frame_locator(".jp-MainAreaWidget iframe").last
    frame.locator(".reveal .slides section.present").first.wait_for(timeout=60_000)
    frame.locator(".reveal .slides").click(position={"x": 5, "y": 5}, force=True)  # keyboard focus
    leaves = frame.locator(".reveal .slides section:not(:has(section))")
    assert leaves.count() == facts.slides, f"RISE made {leaves.count()} slides, the metadata makes {facts.slides}"
    seen = set()
    for _ in range(facts.fragments + 4):
        seen.add(frame.locator(".reveal .slides section.present:not(:has(section))").first.inner_text()[:80])
        page.keyboard.press("Space")
        page.wait_for_timeout(150)
    assert len(seen) >= 3, f"stepping with Space showed only {len(seen)} different slides"
    offline_page.assert_offline(complete=False)


def test_harness_reports_a_cell_that_raises(lab, offline_page) -> None:
    """The run-all check stops at a raising cell at once (not at the timeout) and reports it."""
    _write_probe(lab, "raising_probe.ipynb", ("x = 1", "assert x == 2, 'planted failure'", "y = 3"))
    facts = probe_facts("raising_probe.ipynb", code_cells=3)
    page = offline_page.page
    open_notebook(page, lab, "raising_probe.ipynb", workspace="raising")
    seconds = run_all(page, facts)
    assert seconds < 60, f"the run-all wait noticed the error only after {seconds:.0f} s"
    with pytest.raises(AssertionError, match="planted failure"):
        check_outputs(offline_page, facts)


def test_harness_reports_a_committed_error_in_an_opened_notebook(lab, offline_page) -> None:
    """The opened-not-run check sees an error output that a notebook was saved with."""
    cell = nbformat.v4.new_code_cell("1 / 0", execution_count=1)
    cell.outputs = [
        nbformat.v4.new_output(
            "error",
            ename="ZeroDivisionError",
            evalue="division by zero",
            traceback=["Traceback (most recent call last)", "ZeroDivisionError: division by zero"],
        )
    ]
    _write_probe(lab, "saved_error_probe.ipynb", [cell])
    facts = probe_facts("saved_error_probe.ipynb", code_cells=1)
    page = offline_page.page
    open_notebook(page, lab, "saved_error_probe.ipynb", workspace="saved-error")
    page.wait_for_selector(OUTPUT, timeout=30_000)
    with pytest.raises(AssertionError, match="shows an error"):
        check_saved_outputs(offline_page, facts)
