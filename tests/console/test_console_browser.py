"""The console in a real browser: Debian's Chromium driven by Selenium through chromedriver.

One scenario, as an operator would walk it: log in, see a held Work in Needs you, approve it and
watch it complete (the page updates itself: htmx polls, nobody reloads), cancel a running job,
pause a Routine. A screenshot of every page goes to ``$CONDUIT_ARTIFACTS/console/`` (default
``artifacts/console/`` in the repository, git-ignored) for CI to keep. The browser's console log
must stay free of errors, so a Content-Security-Policy violation (an inline script, an ``eval``)
fails the test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._ci import unavailable
from tests.daemon.conftest import Daemon, job_processes, wait_for

CHROMIUM = os.environ.get("CONDUIT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CONDUIT_CHROMEDRIVER", "/usr/bin/chromedriver")
REPO = Path(__file__).resolve().parents[2]


def _artifacts() -> Path:
    base = os.environ.get("CONDUIT_ARTIFACTS")
    folder = (Path(base) if base else REPO / "artifacts") / "console"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        unavailable(f"Chromium ({CHROMIUM}) and chromedriver ({CHROMEDRIVER}) are not installed "
                    "(apt-get install chromium chromium-driver)")  # fmt: skip
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed (requirements-dev.txt)")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,900", f"--user-data-dir={tmp_path / 'chromium'}",
                "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
    shutil.rmtree(tmp_path / "chromium", ignore_errors=True)


def test_operator_walks_the_console_in_chromium(
    console_daemon: Callable[..., Daemon], browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    from tests.console._live import live_wait

    assert isinstance(browser, WebDriver)
    driver = browser
    daemon = console_daemon()
    daemon.cli("routines", "add", "nightly", "--cron", "0 3 * * *", "--binding", "ok",
               "--timezone", "Europe/Berlin")  # fmt: skip
    base = f"http://127.0.0.1:{daemon.port}"
    shots = _artifacts()
    # A poll may replace what a lookup just found: look again rather than fail.
    wait = live_wait(driver)

    def shot(name: str) -> None:
        assert driver.save_screenshot(str(shots / f"{name}.png")), name

    def text_of(css: str) -> str:
        return str(driver.find_element(By.CSS_SELECTOR, css).text)

    def click(css: str) -> None:
        """Click what ``css`` finds now (found again if a poll replaced it meanwhile)."""
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, css).click() or True)

    # --- log in ----------------------------------------------------------------------------
    driver.get(f"{base}/ui/")
    wait.until(lambda d: d.current_url.endswith("/ui/login"))
    shot("01-login")
    driver.find_element(By.ID, "token").send_keys("wrong")
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: "wrong token" in d.page_source)
    # That 401 is the one error the walk expects: drain it from the browser's log.
    expected = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert all("401" in e["message"] for e in expected), expected
    driver.find_element(By.ID, "token").send_keys(daemon.token)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: d.current_url == f"{base}/ui/")
    cookie = driver.get_cookie("conduit_session")
    assert cookie is not None
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    # HttpOnly: the page's own script cannot read the session.
    assert "conduit_session" not in str(driver.execute_script("return document.cookie"))

    # --- a held Work shows up in Needs you; approve it and watch it complete ----------------
    deploy = daemon.submit("deploy")
    # The menu's count is polled by htmx: it changes without a reload.
    wait.until(lambda d: text_of("#needs-count") == "1")
    # So does the list: the held Work's card appears on the open page, nobody reloads.
    why = wait.until(lambda d: text_of(f'[data-work="{deploy}"] .why'))
    assert why == "deploys need a person <b>now</b>"  # the markup shown as text
    # The input keeps its node across polls (hx-preserve), so this reference never goes stale.
    reason = driver.find_element(By.ID, f"reason-approve-{deploy}")
    reason.send_keys("looks")
    # A poll replaces the list while the reason is being typed: the text and the focus stay.
    driver.execute_script(
        "window.polls = 0; document.body.addEventListener('htmx:afterRequest', e => {"
        " if (e.detail.successful && e.detail.pathInfo.requestPath.startsWith("
        "'/ui/needs-you/list')) window.polls++; });"
    )
    # Two completed polls: the first one's swap has surely happened by the second's end.
    wait.until(lambda d: int(d.execute_script("return window.polls")) >= 2)
    reason = driver.find_element(By.CSS_SELECTOR, f"#reason-approve-{deploy}")
    reason.send_keys(" fine")
    assert reason.get_attribute("value") == "looks fine"
    shot("02-needs-you")
    click(f'[data-work="{deploy}"] button.approve')
    wait.until(lambda d: f"approved {deploy}" in text_of(".flash.ok"))
    driver.get(f"{base}/ui/work/{deploy}")
    wait.until(lambda d: text_of("#work-status") == "completed")  # live, no reload
    assert daemon.runs(deploy) == 1
    assert "launch:" in text_of("#work-live")
    shot("03-work-detail-completed")
    driver.find_element(By.CSS_SELECTOR, "a.artifact[href$='/stdout']").click()
    wait.until(lambda d: d.find_element(By.ID, "artifact-text"))
    shot("04-job-output")

    # --- the Work list updates itself; cancel a running job ------------------------------
    driver.get(f"{base}/ui/work")
    job = daemon.submit("forever")
    wait.until(lambda d: "running" in text_of(f'tr[data-work="{job}"]'))
    shot("05-work-list")
    running = daemon.wait_attempt(job, "running")
    execution = running.attempts[-1].id
    wait_for("the job's process", lambda: job_processes(execution))
    driver.get(f"{base}/ui/work/{job}")
    wait.until(lambda d: text_of("#work-status") == "running")
    driver.find_element(By.CSS_SELECTOR, "form[action$='/cancel'] input[name=reason]").send_keys(
        "stop it"
    )
    driver.find_element(By.ID, "do-cancel").click()
    wait.until(lambda d: text_of("#work-status") == "cancelled")
    shot("06-work-cancelled")
    wait_for("the job's processes to be gone", lambda: not job_processes(execution))

    # --- pause a Routine ---------------------------------------------------------------------
    driver.get(f"{base}/ui/routines")
    routine_row = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, 'tr[data-routine="nightly"]'))
    assert "Europe/Berlin" in routine_row.find_element(By.CSS_SELECTOR, ".next-fire").text
    routine_row.find_element(By.CSS_SELECTOR, "button.pause").click()
    wait.until(lambda d: "paused" in d.find_element(
        By.CSS_SELECTOR, 'tr[data-routine="nightly"]').text)  # fmt: skip
    assert "paused" in daemon.cli("routines", "list").stdout
    shot("07-routines-paused")
    driver.find_element(By.LINK_TEXT, "nightly").click()
    wait.until(lambda d: text_of("#routine-status") == "paused")
    shot("08-routine")

    # --- the remaining pages ----------------------------------------------------------------
    for name, path in (("09-schedules", "/ui/schedules"), ("10-capacity", "/ui/capacity")):
        driver.get(f"{base}{path}")
        wait.until(lambda d: d.find_element(By.TAG_NAME, "h1"))
        shot(name)

    # No script error and no CSP violation on any page of the walk.
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
    # Logging out ends the session: the console asks for the token again.
    driver.find_element(By.CSS_SELECTOR, "form.logout button").click()
    wait.until(lambda d: d.current_url.endswith("/ui/login"))
    driver.get(f"{base}/ui/work")
    wait.until(lambda d: d.current_url.endswith("/ui/login"))
