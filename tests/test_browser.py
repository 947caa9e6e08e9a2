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

from toolkit.policies import POLICIES

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = REPO / "artifacts"
SAMPLE = "total_collision"
LARGE_SAMPLE = "llama_prefill_decode"  # 44 decisions: the Decisions tab must stay bounded
VIEWPORT = {"width": 1440, "height": 1900}
MAX_EXPLORER_HEIGHT = 1500  # px, whatever the number of decisions (it was 11,197 px on the Llama sample)

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
    built_sample(LARGE_SAMPLE)
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
            ctx = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
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

    # nothing overflows sideways at 1440 px: the explorer, the summary and the verification table
    overflow = pg.evaluate("""() => [...document.querySelectorAll(
            '.constshare-explorer, .constshare-summary, .constshare-verification')]
        .filter(el => el.offsetParent !== null && el.scrollWidth > el.clientWidth + 1)
        .map(el => el.className + ' ' + el.scrollWidth + '>' + el.clientWidth)""")
    assert not overflow, overflow

    # the Decisions grid (itables): rows, the culprit marked, a click selects, search filters
    pg.click(".constshare-tabs .lm-TabBar-tab:has-text('Decisions')")
    rows = pg.locator(".constshare-grid table.dataTable tbody tr")
    rows.first.wait_for(state="visible")
    assert rows.count() == 2
    text = pg.inner_text(".constshare-grid")
    assert "_tensor_constant0" in text and "name_hit_unchecked" in text
    culprit = pg.locator(".constshare-grid .cs-culprit").first
    assert "shared" in culprit.inner_text()
    colour = culprit.evaluate("el => getComputedStyle(el).backgroundColor")
    assert colour == "rgb(244, 204, 204)", colour  # the culprit: shared although the content differs
    loaded = pg.locator(".constshare-grid .cs-d-loaded").first
    assert loaded.evaluate("el => getComputedStyle(el).backgroundColor") == "rgb(217, 234, 211)"
    detail = pg.inner_text(".constshare-constant-detail")
    assert "decode / _tensor_constant0" in detail and "content differs: shared anyway" in detail
    pg.locator(".constshare-grid table.dataTable tbody tr", has_text="prefill").first.click()
    pg.wait_for_function("() => (document.querySelector('.constshare-constant-detail')?.textContent || '')"
                         ".includes('prefill / _tensor_constant0')")
    assert "no cache entry" in pg.inner_text(".constshare-constant-detail")
    # sort by method (a header click), then search: the grid follows
    pg.locator(".constshare-grid table.dataTable thead th", has_text="method").first.click()
    pg.wait_for_function("() => document.querySelector('.constshare-grid table.dataTable tbody tr')"
                         "?.textContent.startsWith('decode')")
    pg.locator(".constshare-grid input[type=search]").fill("first_seen")  # only prefill's row
    pg.wait_for_function("() => document.querySelectorAll('.constshare-grid table.dataTable tbody tr').length === 1")
    decisions = _shot(pg, "explorer-decisions.png")
    pg.locator(".constshare-grid input[type=search]").fill("")

    # filter by decision (the dropdown): the grid follows
    pg.select_option(".constshare-filter-decision select", "loaded")
    pg.wait_for_function("() => document.querySelector('.constshare-decisions')?.textContent.includes('1 of 2')")
    assert overview.stat().st_size > 10_000 and decisions.stat().st_size > 10_000
    pg.select_option(".constshare-filter-decision select", label="all")

    # the other tabs, each as an artifact
    pg.click(".constshare-tabs .lm-TabBar-tab:has-text('Timeline')")
    pg.wait_for_function("() => (document.querySelector('img.constshare-timeline')?.naturalWidth || 0) > 200")
    _shot(pg, "explorer-timeline.png")
    pg.click(".constshare-tabs .lm-TabBar-tab:has-text('Export')")
    pg.click("button.constshare-export")
    pg.wait_for_function("() => (document.querySelector('.constshare-export-result')?.textContent || '')"
                         ".includes('wrote')")
    written = pg.inner_text(".constshare-export-result")
    assert str(lab["root"]) in written and "total_collision-name-only-collisions.csv" in written  # absolute
    _shot(pg, "explorer-export.png")

    # every policy: the trade-off plot and the comparison table appear (a background action)
    pg.click(".constshare-tabs .lm-TabBar-tab:has-text('Policies')")
    pg.click("button.constshare-compare")
    pg.wait_for_function(
        f"() => (document.querySelector('.constshare-status')?.textContent || '').includes('compared {len(POLICIES)} "
        "policies')",
        timeout=180_000, polling=500)
    pg.wait_for_function("() => (document.querySelector('img.constshare-tradeoff')?.naturalWidth || 0) > 200")
    assert "verify-always" in pg.inner_text(".constshare-comparison")
    _shot(pg, "explorer-policies.png")

    # a larger program: choosing it greys the old results; loaded, the Decisions tab stays bounded
    pg.select_option(".constshare-sample select", LARGE_SAMPLE)
    pg.wait_for_function("() => (document.querySelector('.constshare-stale-box')?.textContent || '')"
                         ".includes('press Load')")
    assert "constshare-stale" in (pg.get_attribute(".constshare-tabs", "class") or "")
    pg.select_option(".constshare-policy select", "fingerprint")
    pg.click("button.constshare-load")
    pg.wait_for_function(
        "() => (document.querySelector('.constshare-status')?.textContent || '').includes('every loaded method')",
        timeout=180_000, polling=500)
    assert pg.locator(".constshare-stale-box").is_hidden()
    pg.click(".constshare-tabs .lm-TabBar-tab:has-text('Decisions')")
    pg.wait_for_function("() => document.querySelector('.constshare-decisions')?.textContent.includes('44 of 44')")
    rows = pg.locator(".constshare-grid table.dataTable tbody tr")
    rows.first.wait_for(state="visible")
    height = pg.evaluate("() => document.querySelector('.constshare-explorer').getBoundingClientRect().height")
    grid_box = pg.evaluate("() => document.querySelector('.constshare-grid').getBoundingClientRect().toJSON()")
    detail_box = pg.evaluate(
        "() => document.querySelector('.constshare-constant-detail').getBoundingClientRect().toJSON()")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "explorer-measurements.json").write_text(json.dumps(
        {"viewport": VIEWPORT, "sample": LARGE_SAMPLE, "decisions": 44, "explorer_height_px": height,
         "grid": grid_box, "detail": detail_box}, indent=2))
    print(f"explorer height with {LARGE_SAMPLE}'s 44 decisions at {VIEWPORT['width']} px: {height:.0f} px")
    assert height < MAX_EXPLORER_HEIGHT, height
    assert detail_box["x"] >= grid_box["x"] + grid_box["width"] - 1  # the detail beside the grid, not below
    assert detail_box["y"] < grid_box["y"] + grid_box["height"]
    row = rows.nth(30 % rows.count())
    row.scroll_into_view_if_needed()
    picked = row.locator("td").nth(0).inner_text() + " / " + row.locator("td").nth(1).inner_text()
    row.click()
    pg.wait_for_function("(want) => (document.querySelector('.constshare-constant-detail')?.textContent || '')"
                         ".includes(want)", arg=picked)
    assert "same content" in pg.inner_text(".constshare-constant-detail")  # fingerprint shares equal bytes only
    _shot(pg, "explorer-decisions-llama.png")
    overflow = pg.evaluate("""() => [...document.querySelectorAll('.constshare-explorer')]
        .filter(el => el.scrollWidth > el.clientWidth + 1).map(el => el.scrollWidth + '>' + el.clientWidth)""")
    assert not overflow, overflow

    errors = [m for m in pg.console_messages if m.startswith("error") and "widget" in m.lower()]
    assert not errors, errors

    # nothing was written into the committed notebook
    committed = json.loads((REPO / "notebooks" / "explorer.ipynb").read_text())
    assert all(not c.get("outputs") for c in committed["cells"] if c["cell_type"] == "code")
