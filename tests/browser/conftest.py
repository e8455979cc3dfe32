"""Shared machinery of the real-browser tests: Debian's chromium driven by Playwright, offline.

These tests run only through ``make test-browser`` (which ``make test`` calls when chromium is
present): it sets ``COURSE_BROWSER_TESTS=1``. Without it this folder is not collected, so
``pytest tests`` (``make test-lib``) stays fast. With ``COURSE_REQUIRE_BROWSER_TESTS=1`` (set by
``.ci/run``) every reason to skip becomes a failure.

- The browser is ``/usr/bin/chromium`` (or ``$CHROMIUM``), headless, with background networking,
  updates, sync and the like switched off. Playwright never downloads a browser.
- Every page runs in a context that lets through only requests to this machine (127.0.0.1,
  localhost, data:, blob:); anything else is aborted and fails the test that caused it.
- One JupyterLab server (127.0.0.1, random port, random token) serves the whole session, on a copy
  of ``notebooks/`` in a temporary folder, so running cells can never touch the committed notebooks.
- One static HTTP server on 127.0.0.1 serves ``_site/`` (built by ``make slides``/``make html``).
- On failure the page's screenshot and HTML are saved in ``test-artifacts/``.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from course_lib.launch import free_port
from course_lib.launch.guardian import PARENT_ENV, guard, release
from course_lib.manifest import notebook_paths

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = notebook_paths()
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = ROOT / "test-artifacts"
SITE = ROOT / "_site"
ENABLED = os.environ.get("COURSE_BROWSER_TESTS") == "1"
REQUIRED = os.environ.get("COURSE_REQUIRE_BROWSER_TESTS") == "1"

if not ENABLED:
    # Collected only by `make test-browser`; see the module docstring.
    collect_ignore_glob = ["test_*.py"]

CHROMIUM_ARGS = [
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-sync",
    "--disable-breakpad",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication,CertificateTransparencyComponentUpdater",
    "--metrics-recording-only",
    "--no-default-browser-check",
    "--no-first-run",
    "--no-pings",
    "--password-store=basic",
    "--use-mock-keychain",
    "--disable-dev-shm-usage",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}


def skip_or_fail(reason: str) -> None:
    """Skip with a reason, or fail when the browser tests are required (CI)."""
    if REQUIRED:
        pytest.fail(f"browser tests are required (COURSE_REQUIRE_BROWSER_TESTS=1) but: {reason}", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------- the browser


@pytest.fixture(scope="session")
def browser():
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        skip_or_fail(f"no chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@dataclass
class OfflinePage:
    """A page whose requests may only go to this machine; it records what it blocked and its errors."""

    page: object
    blocked: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def assert_offline(self, complete: bool = True) -> None:
        """Nothing was fetched from another machine and (if complete) nothing the page asked for was
        missing. JupyterLab itself probes optional endpoints that answer 404, so it passes False."""
        assert not self.blocked, f"the page tried to reach other machines: {sorted(set(self.blocked))}"
        assert not complete or not self.missing, (
            f"the page asked for files that are not there: {sorted(set(self.missing))}"
        )


def _is_local(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in ("data", "blob", "about"):
        return True
    return parts.hostname in LOCAL_HOSTS


@pytest.fixture
def offline_page(browser, request) -> Iterator[OfflinePage]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, service_workers="block")
    page = context.new_page()
    result = OfflinePage(page)

    def route(r) -> None:
        if _is_local(r.request.url):
            r.continue_()
        else:
            result.blocked.append(r.request.url)
            r.abort("internetdisconnected")

    context.route("**/*", route)
    # Some requests (e.g. CSS @import, fonts) can bypass routing in some chromium versions: also
    # watch every request the page issues.
    page.on("request", lambda req: None if _is_local(req.url) else result.blocked.append(req.url))
    page.on("pageerror", lambda exc: result.page_errors.append(str(exc)))
    page.on("requestfailed", lambda req: result.failed.append(f"{req.url} ({req.failure})"))
    page.on(
        "response",
        lambda resp: (
            result.missing.append(f"{resp.url} ({resp.status})")
            if resp.status >= 400 and not resp.url.endswith("/favicon.ico")
            else None
        ),
    )
    request.node._offline_page = result
    yield result
    context.close()
    if "lab" in request.fixturenames:
        request.getfixturevalue("lab").shutdown_kernels()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    holder = getattr(item, "_offline_page", None)
    if holder is None:
        return
    ARTIFACTS.mkdir(exist_ok=True)
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in item.nodeid.split("::", 1)[-1])
    try:
        holder.page.screenshot(path=str(ARTIFACTS / f"{stem}.png"), full_page=True)
        (ARTIFACTS / f"{stem}.html").write_text(holder.page.content(), encoding="utf-8")
        notes = {
            "blocked": holder.blocked,
            "missing": holder.missing,
            "page_errors": holder.page_errors,
            "failed": holder.failed,
        }
        (ARTIFACTS / f"{stem}.json").write_text(json.dumps(notes, indent=1), encoding="utf-8")
        report.sections.append(("browser artifacts", f"saved test-artifacts/{stem}.png/.html/.json"))
    except Exception as exc:  # a crashed page cannot be captured; say so rather than hide the failure
        report.sections.append(("browser artifacts", f"could not capture the page: {exc}"))


# --------------------------------------------------------------------------- JupyterLab


@dataclass
class Lab:
    base: str
    token: str
    root: Path
    log: Path

    def url(self, notebook: str, workspace: str) -> str:
        return f"{self.base}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={self.token}"

    def shutdown_kernels(self) -> None:
        """End every session and its kernel, so one notebook's kernel does not slow the next."""
        for session in json.loads(self.api("/api/sessions")):
            self.api(f"/api/sessions/{session['id']}", method="DELETE")

    def api(self, path: str, method: str = "GET") -> bytes:
        req = urllib.request.Request(
            f"{self.base}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read()


# User settings for the test server: start the notebook's kernel without asking, keep every cell in
# the DOM (no virtual scrolling), never autosave, never ask the internet for news or updates, and
# give RISE a theme without web fonts.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {
        "windowingMode": "none",
        "autoStartDefaultKernel": True,
    },
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    # RISE's default reveal.js theme ("simple") imports Google Fonts; "white" ships its font. This is
    # the setting docs/instructor_guide.md tells presenters to use offline.
    "jupyterlab-rise/plugin.jupyterlab-settings": {"theme": "white"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "checkForUpdates": False,
        "fetchNews": "false",
    },
}


def start_jupyterlab(
    tmp: Path,
    log: Path,
    notebooks: Path | None = None,
    extra_env: dict[str, str] | None = None,
    _port_retries: int = 2,
) -> tuple[subprocess.Popen[bytes], Lab]:
    """A JupyterLab server on a copy of the notebooks in ``tmp``, answering; guarded by this process's guardian.

    ``notebooks``: the folder to copy them from (default: the course's ``notebooks/``); ``extra_env``: more
    environment for the server and its kernels.

    The server runs in a session of its own, so that stopping it stops its kernels; the guardian
    (``course_lib.launch.guardian``) kills it, and every kernel it started (they carry this process's mark in
    their environment), if this process dies first, even by SIGKILL.
    """
    root = tmp / "notebooks"
    # The notebooks alone: the server needs nothing else, and notebooks/_runs holds what nbval's kernels wrote
    # (scripts, checkpoints, logs), possibly still being written.
    root.mkdir(parents=True)
    for notebook in sorted((notebooks or ROOT / "notebooks").glob("*.ipynb")):
        shutil.copy2(notebook, root / notebook.name)
    settings = tmp / "settings"
    for name, values in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        IPYTHONDIR=str(tmp / "ipython"),
        PYTHONUNBUFFERED="1",
        **(extra_env or {}),
    )
    env[PARENT_ENV] = str(os.getpid())  # the guardian's sweep finds the server and its kernels by this mark
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        "--LabApp.extension_manager=readonly",
        "--ServerApp.allow_root=True",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    guard(proc.pid)
    server = Lab(base=f"http://127.0.0.1:{port}", token=token, root=root, log=log)
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            stop_jupyterlab(proc, server)
            if "is not available" in log.read_text() and _port_retries > 0:  # the free port was taken meanwhile
                return start_jupyterlab(tmp / f"retry{_port_retries}", log, notebooks, extra_env, _port_retries - 1)
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            server.api("/api/status")
            return proc, server
        except OSError:
            if time.monotonic() > deadline:
                stop_jupyterlab(proc, server)
                raise RuntimeError(f"JupyterLab did not answer within 90 s:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.3)


def stop_jupyterlab(proc: subprocess.Popen[bytes], server: Lab) -> None:
    """Shut the server down (its kernels too), then kill whatever is left of its process group."""
    try:  # a clean stop also shuts the kernels down
        server.api("/api/shutdown", method="POST")
        proc.wait(timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:  # whatever is left of the server's process group (kernels included)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
    release(proc.pid)


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Iterator[Lab]:
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        proc, server = start_jupyterlab(tmp_path_factory.mktemp("lab"), ARTIFACTS / "jupyterlab-server.log")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        stop_jupyterlab(proc, server)


# --------------------------------------------------------------------------- the built site


@pytest.fixture(scope="session")
def site() -> Path:
    """Build the decks and the static site from the notebooks as they are now, as `make html` does."""
    if not (ROOT / "node_modules" / "reveal.js" / "package.json").exists():
        skip_or_fail("node_modules/ is missing: run `npm ci` (the decks and site need the pinned assets)")
    for script in ("build_slides.py", "build_site.py"):
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / script)], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"scripts/{script} failed:\n{done.stdout}\n{done.stderr}"
    return SITE


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def site_url(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
