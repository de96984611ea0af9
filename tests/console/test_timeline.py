"""A Work's history, the live output of running jobs, and the console's fixes (issue 35).

One daemon (SQLite, the human gate on ``deploy``, a per-scope budget) and one Chromium serve the
whole module, to keep its cost small. The API and CLI tests read ``/v1/work/{id}/history`` and
``/v1/work/{id}/attempts/{n}/output``; the browser tests walk what an operator sees: the timeline,
a running job's output growing, actions that follow the Work's state, Approve/Refuse on a held
Work's page, focus kept across live refreshes, a skip link, 390 px, dark mode, human budget times.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from conduit_core.http import HistoryPage, OutputTail
from tests._ci import unavailable
from tests.console.conftest import CONSOLE_EXTRA, GATE_RULES, Console
from tests.daemon.conftest import Daemon, _kill_jobs_under, job_processes, wait_for

REPO = Path(__file__).resolve().parents[2]
TEST_IMAGE = "conduit-test-busybox:latest"
CHROMIUM = os.environ.get("CONDUIT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CONDUIT_CHROMEDRIVER", "/usr/bin/chromedriver")

MORE = """
[bindings.chatty]
executor = "shell"
config = {{ command = 'i=0; while true; do i=$((i+1)); echo tick-$i; echo err-$i >&2; sleep 0.2; done', stop_grace_seconds = 2 }}

[bindings.pychatty]
executor = "python"
config = {{ function = "tests.pyexec.funcs:run_script", env = {{ PYTHONPATH = "{repo}", PYEXEC_SCRIPT = "echo py-line; echo py-err >&2; sleep 300" }} }}

[bindings.wirechatty]
executor = "example-wire"
config = {{ command = 'echo wire-line; echo wire-err >&2; sleep 300' }}

[bindings.boxchatty]
executor = "container"
config = {{ image = "{image}", command = 'echo box-line; echo box-err >&2; sleep 300' }}

[bindings.boxdone]
executor = "container"
config = {{ image = "{image}", command = 'echo box-done' }}

[scopes.capped]

[bindings.capped]
executor = "shell"
scope = "capped"
config = {{ command = 'echo capped' }}

[[budgets]]
name = "cost"
unit = "attempts"
max = 1
per = "scope"
scope = "capped"
period = "day"
"""


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("timeline")
    rules = root / "human.toml"
    rules.write_text(GATE_RULES)
    extra = CONSOLE_EXTRA.format(root=root, side=root / "side-effects.log")
    extra += MORE.format(repo=REPO, image=TEST_IMAGE)
    daemon = Daemon(root, str(root / "conduit.db"), extra=extra)
    daemon.start(env={"CONDUIT_HUMAN_GATE_CONFIG": str(rules)})
    yield daemon
    daemon.kill()
    _kill_jobs_under(root)


def history(d: Daemon, work_id: str, query: str = "") -> HistoryPage:
    return d.api().request("GET", f"/v1/work/{work_id}/history{query}", None, HistoryPage)


def output(d: Daemon, work_id: str, attempt: int = 1, query: str = "") -> OutputTail:
    path = f"/v1/work/{work_id}/attempts/{attempt}/output{query}"
    return d.api().request("GET", path, None, OutputTail)


def kinds(page: HistoryPage) -> list[str]:
    return [e.kind for e in page.items]


def post(d: Daemon, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return d.raw("POST", path, msgspec.json.encode(body))


# --- history: API and CLI ----------------------------------------------------------------------


def test_history_shows_gate_decisions_cancels_and_interrupts_with_reasons(d: Daemon) -> None:
    approved = d.submit("deploy")
    d.wait_status(approved, "held")
    assert post(d, f"/v1/work/{approved}/approve", {"reason": "looks fine"})[0] == 200
    d.wait_status(approved, "completed")
    page = history(d, approved)
    got = kinds(page)
    # In order: created, its input, the gate's hold and approval, the attempt and its phases.
    for earlier, later in (("created", "input"), ("input", "gate_held"),
                           ("gate_held", "gate_approved"), ("gate_approved", "attempt_started"),
                           ("attempt_started", "attempt_ended")):  # fmt: skip
        assert got.index(earlier) < got.index(later), got
    assert "phase" in got
    decision = next(e for e in page.items if e.kind == "gate_approved")
    assert decision.reason == "looks fine"
    held = next(e for e in page.items if e.kind == "gate_held")
    assert held.reason == "deploys need a person <b>now</b>"
    assert [e.at_ms for e in page.items] == sorted(e.at_ms for e in page.items)
    assert next(e for e in page.items if e.kind == "input").summary.endswith("(taken by attempt 1)")

    refused = d.submit("deploy")
    d.wait_status(refused, "held")
    assert post(d, f"/v1/work/{refused}/refuse", {"reason": "not today"})[0] == 200
    entry = next(e for e in history(d, refused).items if e.kind == "gate_refused")
    assert entry.reason == "not today"

    # Cancel and interrupt reasons were only logged: now each is recorded.
    job = d.submit("forever")
    d.wait_attempt(job, "running")
    assert post(d, f"/v1/work/{job}/interrupt", {"reason": "poke it"})[0] == 202
    wait_for("the interrupt to end the attempt",
             lambda: d.show(job).attempts[-1].status.terminal)  # fmt: skip
    assert post(d, f"/v1/work/{job}/cancel", {"reason": "stop it"})[0] == 200
    # Its entries settle once the host has verified the stop (the attempt's end says so).
    wait_for("the stop to be verified",
             lambda: all(a.exclusion_confirmed for a in d.show(job).attempts))  # fmt: skip
    page = history(d, job)
    assert next(e for e in page.items if e.kind == "interrupted").reason == "poke it"
    assert next(e for e in page.items if e.kind == "cancelled").reason == "stop it"
    # Who did it: the name of the token the request came with (the daemon's own: "default").
    assert {e.actor for e in page.items if e.kind in ("cancelled", "interrupted")} == {"default"}

    # Paging, both orders; a bad query is a coded 400.
    first = history(d, job, "?limit=2")
    assert len(first.items) == 2
    assert first.next == "2"
    assert first.total == len(page.items)
    rest = history(d, job, f"?limit=500&after={first.next}")
    assert [*first.items, *rest.items] == page.items
    assert rest.next is None
    newest = history(d, job, "?order=newest&limit=500")
    assert newest.items == list(reversed(page.items))
    for query in ("?order=sideways", "?limit=0", "?after=x", "?nope=1"):
        status, body = d.raw("GET", f"/v1/work/{job}/history{query}")
        assert (status, body["code"]) == (400, "invalid_query"), query
    status, body = d.raw("GET", "/v1/work/no-such-work/history")
    assert (status, body["code"]) == (404, "not_found")

    # The CLI prints the same, with the reason and who ("—": not recorded).
    out = d.cli("work", "history", job).stdout
    assert "cancelled" in out
    assert "reason: stop it" in out
    assert "[by —]" in out
    as_json = msgspec.json.decode(d.cli("work", "history", job, "--json").stdout)
    assert [e["kind"] for e in as_json["items"]] == kinds(page)


def test_history_shows_a_retry_armed_and_fired(d: Daemon) -> None:
    work = d.submit("flaky")  # fails once, retried after 0.2 s, then completes
    d.wait_status(work, "completed")
    got = kinds(history(d, work))
    ended = [i for i, k in enumerate(got) if k == "attempt_ended"]
    assert len(ended) == 2, got
    assert ended[0] < got.index("retry_armed") < got.index("retry_fired") < ended[1], got


def test_budget_holds_show_dates_not_milliseconds(d: Daemon) -> None:
    d.wait_status(d.submit("capped"), "completed")
    over = d.submit("capped")
    d.wait_status(over, "held")
    assert re.search(r"day:\d{13}", d.show(over).holds[0].holder)  # the store keeps the key
    console = Console(d)
    try:
        assert console.login().status_code == 303
        for path in ("/ui/", f"/ui/work/{over}"):
            text = console.get(path).text
            assert not re.search(r"day:\d{13}|window from \d{13}", text), path
            assert re.search(r"day of \d{4}-\d{2}-\d{2}", text), path
    finally:
        console.close()
    d.cli("work", "cancel", over)


# --- live output: API ----------------------------------------------------------------------


def test_live_output_of_a_running_shell_job_then_its_cancelled_attempt(d: Daemon) -> None:
    job = d.submit("chatty")
    d.wait_attempt(job, "running")
    tail = wait_for("tick-3 in stdout", lambda: (t := output(d, job)).available
                    and "tick-3" in t.text and t)  # fmt: skip
    assert tail.running
    assert tail.stream == "stdout"
    assert "err-" not in tail.text
    grown = wait_for("more output", lambda: (t := output(d, job)).bytes > tail.bytes and t)
    assert grown.text.startswith(tail.text[:6])
    assert "err-1" in output(d, job, query="?stream=stderr").text
    small = output(d, job, query="?tail=5")
    assert small.bytes == 5
    assert small.text.endswith("\n")
    for query, code in (("?stream=stdin", "invalid_query"), ("?tail=0", "invalid_query"),
                        ("?tail=2000000", "invalid_query")):  # fmt: skip
        status, body = d.raw("GET", f"/v1/work/{job}/attempts/1/output{query}")
        assert (status, body["code"]) == (400, code), query
    status, body = d.raw("GET", f"/v1/work/{job}/attempts/9/output")
    assert (status, body["code"]) == (404, "not_found")
    d.cli("work", "cancel", job, "--reason", "enough")
    d.wait_status(job, "cancelled")
    ended = output(d, job)
    assert not ended.running
    assert ended.available
    assert "tick-1" in ended.text


def test_live_output_of_a_python_job(d: Daemon) -> None:
    job = d.submit("pychatty")
    d.wait_attempt(job, "running")
    wait_for("py-line", lambda: "py-line" in output(d, job).text)
    assert "py-err" in output(d, job, query="?stream=stderr").text
    d.cli("work", "cancel", job)


def test_live_output_of_a_wire_program_job(d: Daemon) -> None:
    """An out-of-process program that declares the ``output`` capability answers ``output``
    (the example writes both streams to one file, offered as stdout)."""
    job = d.submit("wirechatty")
    d.wait_attempt(job, "running")
    text = wait_for("wire-line", lambda: (t := output(d, job).text) and "wire-line" in t and t)
    assert "wire-err" in text
    stderr = output(d, job, query="?stream=stderr")
    assert not stderr.available
    assert stderr.note == "executor 'example-wire' keeps no stderr for this attempt"
    assert output(d, job, query="?tail=5").text == text[-5:]
    d.cli("work", "cancel", job)
    d.wait_status(job, "cancelled")


def test_live_output_of_a_container_job(d: Daemon) -> None:
    try:
        import docker

        client = docker.APIClient()
        client.inspect_image(TEST_IMAGE)
        client.close()
    except Exception as exc:
        unavailable(f"Docker with {TEST_IMAGE} is needed ({type(exc).__name__})")
    job = d.submit("boxchatty")
    d.wait_attempt(job, "running", timeout=60)
    wait_for("box-line", lambda: "box-line" in output(d, job).text)
    assert "box-err" in output(d, job, query="?stream=stderr").text
    d.cli("work", "cancel", job)
    d.wait_status(job, "cancelled")
    # Once its stop is verified the container is removed, and with it the engine's log: a
    # cancelled container's output is not kept (only an ended one's captured tail is).
    wait_for("the container's stop", lambda: d.show(job).attempts[-1].exclusion_confirmed)
    gone = output(d, job)
    assert not gone.available
    assert gone.note == "executor 'container' keeps no stdout for this attempt"
    # One that ended by itself: its tail captured into the result directory is read.
    done = d.submit("boxdone")
    d.wait_status(done, "completed", timeout=60)
    wait_for("its stop", lambda: d.show(done).attempts[-1].exclusion_confirmed)
    assert output(d, done).text == "box-done\n"


# --- the daemon says where the console is --------------------------------------------------


def test_the_daemon_prints_the_console_url_and_root_sends_browsers_there(d: Daemon) -> None:
    assert f"console: http://127.0.0.1:{d.port}/ui/" in d.log()
    base = f"http://127.0.0.1:{d.port}"
    html = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    browser = httpx.get(f"{base}/", headers=html, follow_redirects=False)
    assert browser.status_code == 303
    assert browser.headers["location"] == "/ui/"
    # API clients keep their JSON answers at the root.
    for headers in ({"Accept": "application/json"}, {}):
        api = httpx.get(f"{base}/", headers=headers)
        assert (api.status_code, api.json()["code"]) == (401, "unauthorized")
    status, body = d.raw("GET", "/")
    assert (status, body["code"]) == (404, "not_found")
    assert httpx.post(f"{base}/", headers=html).status_code == 401


def test_the_empty_routines_hint_is_a_config_that_config_check_accepts(d: Daemon) -> None:
    console = Console(d)
    try:
        console.login()
        page = console.get("/ui/routines").text
    finally:
        console.close()
    found = re.search(r'<pre class="payload" id="routine-example">(.*?)</pre>', page, re.S)
    assert found, page
    example = found.group(1).replace("&#34;", '"').replace("&quot;", '"')
    config = d.root / "with-routine.toml"

    def check(text: str) -> subprocess.CompletedProcess[str]:
        config.write_text(d.config.read_text() + "\n" + text)
        return subprocess.run(
            [sys.executable, "-m", "conduit_core.cli", "config", "check", str(config)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    done = check(example)
    assert done.returncode == 0, done.stdout + done.stderr
    # The old hint's shape is what `config check` refused.
    done = check('[routines.nightly]\ncron = "0 3 * * *"\nbinding = "ok"\n')
    assert done.returncode != 0
    assert "expected an array of tables" in done.stdout + done.stderr


# --- in Chromium -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        unavailable(f"Chromium ({CHROMIUM}) and chromedriver ({CHROMEDRIVER}) are not installed "
                    "(apt-get install chromium chromium-driver)")  # fmt: skip
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed (requirements-dev.txt)")
    profile = tmp_path_factory.mktemp("chromium")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,900", f"--user-data-dir={profile}", "--no-first-run",
                "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Walk:
    """The browser, logged in to the module's daemon, with the waits the tests share."""

    def __init__(self, driver: Any, d: Daemon) -> None:
        from tests.console._live import live_wait

        self.driver = driver
        self.d = d
        self.base = f"http://127.0.0.1:{d.port}"
        self.wait = live_wait(driver)

    def open(self, path: str) -> None:
        self.driver.get(f"{self.base}{path}")
        if self.driver.current_url.endswith("/ui/login"):
            from selenium.webdriver.common.by import By

            self.driver.find_element(By.ID, "token").send_keys(self.d.token)
            self.driver.find_element(By.ID, "login").click()
            self.wait.until(lambda dr: not dr.current_url.endswith("/ui/login"))
            self.driver.get(f"{self.base}{path}")

    def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def text(self, selector: str) -> str:
        """The first match's text (``""``: none); a node a refresh replaced meanwhile raises,
        and ``until`` (a ``live_wait``) looks again."""
        found = self.css(selector)
        return str(found[0].text) if found else ""

    def until(self, what: Callable[[], Any]) -> Any:
        return self.wait.until(lambda _: what())

    def count_polls(self, prefix: str) -> Callable[[], int]:
        """How many polls of ``prefix`` completed since now (a poll's swap has surely happened
        by the end of the one after it)."""
        self.driver.execute_script(
            "window.polls = 0; document.body.addEventListener('htmx:afterRequest', e => {"
            " const p = e.detail.pathInfo && e.detail.pathInfo.requestPath;"
            f" if (p && p.startsWith('{prefix}')) window.polls++; }});"
        )
        return lambda: int(self.driver.execute_script("return window.polls"))

    def errors(self) -> list[Any]:
        return [e for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture(scope="module")
def walk(browser: Any, d: Daemon) -> Walk:
    return Walk(browser, d)


def test_browser_timeline_and_live_output(walk: Walk, d: Daemon) -> None:
    job = d.submit("chatty")
    d.wait_attempt(job, "running")
    walk.open(f"/ui/work/{job}")
    first = walk.until(lambda: (t := walk.text("#live-stdout")) and "tick-" in t and t)
    # The output grows on the open page: nobody reloads.
    walk.until(lambda: walk.text("#live-stdout") not in ("", first))
    assert "err-" in walk.text("#live-stderr")
    # Once it overflows its box, the live output shows its end after each refresh.
    walk.until(lambda: walk.driver.execute_script(
        "const p = document.getElementById('live-stdout');"
        "return p.scrollHeight > p.clientHeight + 50"))  # fmt: skip
    polls = walk.count_polls(f"/ui/work/{job}/live")
    walk.until(lambda: polls() >= 1)
    assert walk.driver.execute_script(
        "const p = document.getElementById('live-stdout');"
        "return p.scrollTop + p.clientHeight >= p.scrollHeight - 4")  # fmt: skip
    walk.css("#do-cancel")[0].click()
    walk.until(lambda: walk.text("#work-status") == "cancelled")
    assert walk.css("#live-stdout") == []
    # The cancelled attempt's history and its stdout/stderr links.
    walk.until(lambda: walk.css('#history tr[data-kind="cancelled"]'))
    assert "attempt 1 ended cancelled" in walk.text("#history")
    walk.css("#out-1-stdout")[0].click()
    walk.until(lambda: "tick-1" in walk.text("#artifact-text"))
    assert walk.errors() == []


def test_browser_held_work_offers_approve_refuse_and_actions_follow_state(
    walk: Walk, d: Daemon
) -> None:
    held = d.submit("deploy")
    d.wait_status(held, "held")
    walk.open(f"/ui/work/{held}")
    walk.until(lambda: walk.css("#do-approve"))
    assert walk.css("#do-refuse")
    assert walk.css("#do-cancel")
    assert walk.css("#do-interrupt") == []  # nothing runs: Interrupt would be 409 not_running
    assert "pending" in walk.text("table.inputs")
    walk.css(f"#reason-approve-{held}")[0].send_keys("ship it")
    walk.css("#do-approve")[0].click()
    walk.until(lambda: walk.text("#work-status") == "completed")
    # After completion: no action but the note, and the input is no longer "pending".
    walk.until(lambda: walk.css("#no-actions"))
    for gone in ("#do-cancel", "#do-interrupt", "#do-inject", "#do-approve"):
        assert walk.css(gone) == [], gone
    assert "pending" not in walk.text("table.inputs")
    walk.until(lambda: walk.css('#history tr[data-kind="gate_approved"]'))
    assert "ship it" in walk.text('#history tr[data-kind="gate_approved"]')

    # A Work that completes while its page is open: the live part drops the actions by itself.
    job = d.submit("held")
    d.wait_attempt(job, "running")
    walk.open(f"/ui/work/{job}")
    walk.until(lambda: walk.css("#do-interrupt"))
    assert walk.css("#do-cancel")
    assert walk.css("#do-inject")
    d.release(job)
    walk.until(lambda: walk.css("#no-actions"))
    assert walk.css("#do-cancel") == []
    assert walk.css("#do-interrupt") == []
    assert walk.errors() == []


def test_browser_keeps_focus_across_live_refreshes(walk: Walk, d: Daemon) -> None:
    # The Work list (polled every 2 s): a row's link keeps the focus.
    d.wait_status(d.submit("ok"), "completed")
    walk.open("/ui/work")
    walk.until(lambda: walk.css("#work-rows a"))
    # Found and focused in one step: a poll may replace the row between two steps.
    href = walk.driver.execute_script(
        "const a = document.querySelector('#work-rows a'); a.focus();"
        "return document.activeElement === a ? a.href : null")  # fmt: skip
    assert href
    polls = walk.count_polls("/ui/work/rows")
    walk.until(lambda: polls() >= 3)
    active = walk.driver.switch_to.active_element
    assert active.tag_name == "a"
    assert active.get_attribute("href") == href

    # Needs you (every 3 s): an Approve button keeps the focus.
    held = d.submit("deploy")
    walk.open("/ui/")
    walk.until(lambda: walk.css(f'[data-work="{held}"] button.approve'))
    assert walk.driver.execute_script(
        "const b = document.querySelector(arguments[0]); b.focus();"
        "return document.activeElement === b", f'[data-work="{held}"] button.approve')
    polls = walk.count_polls("/ui/needs-you/list")
    walk.until(lambda: polls() >= 3)
    active = walk.driver.switch_to.active_element
    assert active.tag_name == "button"
    assert "approve" in (active.get_attribute("class") or "")
    assert active.find_element("xpath", "ancestor::section").get_attribute("data-work") == held
    d.cli("work", "cancel", held)


def test_browser_skip_link_dark_mode_and_390_px(walk: Walk, d: Daemon) -> None:
    from selenium.webdriver.common.keys import Keys

    driver = walk.driver
    walk.open("/ui/work")
    # The first Tab reaches the skip link; following it moves the focus to the content.
    driver.find_element("tag name", "body").send_keys(Keys.TAB)
    assert driver.switch_to.active_element.get_attribute("id") == "skip"
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    walk.until(lambda: driver.switch_to.active_element.get_attribute("id") == "main")

    def background() -> str:
        return str(driver.execute_script(
            "return getComputedStyle(document.body).backgroundColor"))  # fmt: skip

    assert background() == "rgb(247, 248, 250)"
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": "dark"}]})  # fmt: skip
    try:
        assert background() == "rgb(15, 20, 26)"
    finally:
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

    held = d.submit("deploy")
    d.wait_status(held, "held")
    driver.set_window_size(390, 844)
    try:
        width = driver.execute_script("return window.innerWidth")
        for path in ("/ui/", "/ui/work", f"/ui/work/{held}", "/ui/routines", "/ui/schedules",
                     "/ui/capacity"):  # fmt: skip
            walk.open(path)
            walk.until(lambda: walk.css("h1"))
            wide = driver.execute_script("return document.documentElement.scrollWidth")
            assert wide <= width, f"{path} is {wide} px wide at {width} px"
            for selector in ('nav a[href="/ui/capacity"]', "form.logout button"):
                box = driver.execute_script(
                    "const r = arguments[0].getBoundingClientRect();"
                    "return [r.left, r.right, r.width];", walk.css(selector)[0])  # fmt: skip
                assert box[2] > 0, (path, selector, box)
                assert box[0] >= 0, (path, selector, box)
                assert box[1] <= width, (path, selector, box)
        driver.get(f"{walk.base}/ui/login")  # the login form too (it shows with a session)
        walk.until(lambda: walk.css("#token"))
        assert driver.execute_script("return document.documentElement.scrollWidth") <= width
    finally:
        driver.set_window_size(1300, 900)
    d.cli("work", "cancel", held)
    assert walk.errors() == []


def test_browser_budget_hold_shows_dates(walk: Walk, d: Daemon) -> None:
    over = d.submit("capped")  # the scope's one attempt of the day is spent (or spent now)
    status = d.wait_status(over, "held", "completed").work.status
    if str(status) == "completed":
        over = d.submit("capped")
        d.wait_status(over, "held")
    walk.open("/ui/")
    card = walk.until(lambda: walk.text(f'[data-work="{over}"]'))
    assert re.search(r"day of \d{4}-\d{2}-\d{2}", card)
    # No raw epoch milliseconds; the Work's own id (whose 14 hex digits after the sequence
    # number are all decimal now and then) is not one.
    assert not re.search(r"\d{13}", card.replace(over, "<id>"))
    d.cli("work", "cancel", over)


def test_every_job_started_here_is_gone(d: Daemon) -> None:
    """Every job a test here cancelled has stopped (the module's daemon is shared)."""
    status, page = d.raw("GET", "/v1/work?limit=500")
    assert status == 200
    for work in page["items"]:
        for attempt in d.show(work["id"]).attempts:
            wait_for(f"{attempt.id} to stop", lambda a=attempt.id: not job_processes(a))
