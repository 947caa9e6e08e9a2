"""A real browser: JupyterLab headless, the explorer notebook in Chromium, driven by Playwright.

Needs Debian's chromium at /usr/bin/chromium (``.ci/install_browser.sh``); Playwright's own
browser downloads are never used.  The notebook is copied into a temporary server root so
running it cannot write outputs into the committed file.  Screenshots go to ``artifacts/``
(a CI artifact); the widget one also becomes ``docs/explorer.png`` for the README when that
file is missing or ``CONSTSHARE_UPDATE_SCREENSHOTS=1`` is set.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import in_ci, require

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = REPO / "artifacts"
SAMPLE = "total_collision"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


@pytest.fixture(scope="module")
def lab(tmp_path_factory, built_sample):
    """A JupyterLab server on a free localhost port, isolated config, token auth."""
    require("jupyterlab", extra="notebook")
    built_sample(SAMPLE)  # compile before the browser waits on it (shared cache)
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(REPO / "notebooks" / "explorer.ipynb", root / "explorer.ipynb")
    home = tmp_path_factory.mktemp("jupyter-home")
    env = dict(os.environ)
    env.update({
        "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"), "MPLBACKEND": "agg",
        "CONSTSHARE_CACHE": os.environ["CONSTSHARE_CACHE"],  # set by conftest: the kernel reuses the build
    })
    # never fetch news or check for updates (no network in CI, and no toast over the screenshots)
    notif = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notif.parent.mkdir(parents=True)
    notif.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
    port, token = _free_port(), secrets.token_hex(16)
    log = open(root.parent / "jupyter-lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly",
         "--ServerApp.terminals_enabled=False"] + (["--allow-root"] if os.geteuid() == 0 else []),
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while _get(f"{base}/api/status?token={token}") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("jupyter lab did not start:\n" + (root.parent / "jupyter-lab.log").read_text()[-3000:])
            time.sleep(0.5)
        yield {"base": base, "token": token, "root": root}
    finally:
        req = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST", data=b"")
        try:
            urllib.request.urlopen(req, timeout=10)
        except (urllib.error.URLError, OSError):
            pass
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


@pytest.fixture(scope="module")
def page(lab):
    if not CHROMIUM.exists():
        msg = "needs Debian's chromium at /usr/bin/chromium: run .ci/install_browser.sh as root"
        if in_ci():  # CI installs it: a missing browser there is a failure, not a skip
            pytest.fail(msg)
        pytest.skip(msg)
    sync_api = require("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            ctx = browser.new_context(viewport={"width": 1500, "height": 1900}, device_scale_factor=1)
            pg = ctx.new_page()
            pg.set_default_timeout(60_000)
            messages: list[str] = []
            pg.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
            pg.goto(f"{lab['base']}/lab/tree/explorer.ipynb?token={lab['token']}")
            pg.console_messages = messages
            yield pg
        finally:
            browser.close()


def _shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path


def _update_readme_screenshot(png: Path) -> None:
    """docs/explorer.png (shown in the README) is a tracked file: it is written when missing or
    when CONSTSHARE_UPDATE_SCREENSHOTS=1, so an ordinary test run leaves the tree clean."""
    target = REPO / "docs" / "explorer.png"
    if not target.exists() or os.environ.get("CONSTSHARE_UPDATE_SCREENSHOTS") == "1":
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(png, target)


def _kernel_idle_js() -> str:
    return """() => {
        const app = window.jupyterapp; if (!app) return false;
        const w = app.shell.currentWidget; if (!w || !w.sessionContext) return false;
        const k = w.sessionContext.session && w.sessionContext.session.kernel;
        return !!k && k.status === 'idle';
    }"""


def test_explorer_in_jupyterlab(page, lab):
    pg = page
    pg.wait_for_selector(".jp-Notebook", state="visible", timeout=120_000)
    pg.wait_for_function(_kernel_idle_js(), timeout=120_000, polling=500)
    # a clean, wide view: no side panels
    pg.evaluate("""async () => {
        const app = window.jupyterapp;
        app.shell.collapseLeft(); app.shell.collapseRight();
        await app.commands.execute('notebook:run-all-cells');
    }""")
    try:
        pg.wait_for_selector(".constshare-explorer", state="visible", timeout=180_000)
    except Exception:
        _shot(pg, "explorer-failed.png")
        raise AssertionError("the explorer widget did not render; console:\n" + "\n".join(pg.console_messages[-30:]))

    # choose a policy and load
    pg.select_option(".constshare-policy select", "name-only")
    pg.wait_for_function("() => document.querySelector('.constshare-policy-info')"
                         "?.textContent.includes('share on name alone')")
    pg.click("button.constshare-load")
    try:
        pg.wait_for_function(
            "() => (document.querySelector('.constshare-status')?.textContent || '').includes('WRONG OUTPUT in decode')",
            timeout=180_000, polling=500)
    except Exception:
        _shot(pg, "explorer-failed.png")
        status = pg.inner_text(".constshare-explorer")
        raise AssertionError(f"the load did not finish as expected; widget text:\n{status[-3000:]}")
    assert pg.locator(".constshare-error-box").is_hidden()

    # the overview: summary, verification and the collision matrix plot
    summary = pg.inner_text(".constshare-summary")
    assert "under policy 'name-only': loaded" in summary
    assert "WRONG" in pg.inner_text(".constshare-verification")
    img = pg.locator("img.constshare-plot")
    img.wait_for(state="visible")
    size = img.evaluate("el => [el.naturalWidth, el.naturalHeight, el.complete]")
    assert size[2] and size[0] > 200 and size[1] > 100, size
    overview = _shot(pg, "explorer-overview.png")
    widget_png = ARTIFACTS / "explorer.png"
    pg.locator(".constshare-explorer").screenshot(path=str(widget_png))
    _update_readme_screenshot(widget_png)

    # the decision table, rendered in the Decisions tab
    pg.click(".constshare-tabs .lm-TabBar-tab:has-text('Decisions')")
    table = pg.locator(".constshare-decisions table")
    table.wait_for(state="visible")
    rows = table.locator("tbody tr")
    assert rows.count() == 2
    text = table.inner_text()
    assert "_tensor_constant0" in text and "name_hit_unchecked" in text
    shared = table.locator("td", has_text="shared").first
    colour = shared.evaluate("el => getComputedStyle(el).backgroundColor")
    assert colour == "rgb(207, 226, 243)", colour  # DECISION_COLOURS['shared']
    detail = pg.inner_text(".constshare-constant-detail")
    assert "decode / _tensor_constant0" in detail and "cached vs new" in detail

    # filter by decision: the table follows
    pg.select_option(".constshare-filter-decision select", "loaded")
    pg.wait_for_function("() => document.querySelector('.constshare-decisions')?.textContent.includes('1 of 2')")
    decisions = _shot(pg, "explorer-decisions.png")
    assert overview.stat().st_size > 10_000 and decisions.stat().st_size > 10_000

    # every policy: the trade-off plot and the comparison table appear (a background action)
    pg.click(".constshare-tabs .lm-TabBar-tab:has-text('Policies')")
    pg.click("button.constshare-compare")
    pg.wait_for_function(
        "() => (document.querySelector('.constshare-status')?.textContent || '').includes('compared 7 policies')",
        timeout=180_000, polling=500)
    pg.wait_for_function("() => (document.querySelector('img.constshare-tradeoff')?.naturalWidth || 0) > 200")
    assert "verify-always" in pg.inner_text(".constshare-comparison")
    _shot(pg, "explorer-policies.png")
    errors = [m for m in pg.console_messages if m.startswith("error") and "widget" in m.lower()]
    assert not errors, errors

    # nothing was written into the committed notebook
    committed = json.loads((REPO / "notebooks" / "explorer.ipynb").read_text())
    assert all(not c.get("outputs") for c in committed["cells"] if c["cell_type"] == "code")
