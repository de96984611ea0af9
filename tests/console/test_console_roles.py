"""Named tokens in the console: a viewer sees no action and a forged action is refused (over
HTTP and in Chromium), an operator acts and the action records its name, and wrong tokens at the
login are throttled per address.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from tests.console.conftest import Console
from tests.console.test_console_browser import browser  # noqa: F401  (the Chromium fixture)
from tests.daemon.conftest import Daemon, wait_for
from tests.daemon.test_tokens import TOKEN_CONFIG, TOKENS, events, write_tokens

VIEWER, OPERATOR = TOKENS["watcher"], TOKENS["ops"]
#: Any form that would change something (logout is a POST too, and allowed to everyone).
_ACTION_FORM = re.compile(r'<form method="post" action="/ui/(work|schedules)/')


def _start(console_daemon: Callable[..., Daemon], tmp_path: Path) -> Daemon:
    write_tokens(tmp_path)
    daemon = console_daemon(more=TOKEN_CONFIG.format(root=tmp_path))
    daemon.cli("routines", "add", "nightly", "--cron", "0 3 * * *", "--binding", "ok")
    return daemon


def test_a_viewer_sees_no_action_and_a_forged_one_is_refused(
    console_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = _start(console_daemon, tmp_path)
    deploy = daemon.submit("deploy")
    daemon.wait_status(deploy, "held")
    viewer = Console(daemon)
    try:
        assert viewer.login(VIEWER).status_code == 303
        for path in ("/ui/", "/ui/needs-you/list", f"/ui/work/{deploy}", "/ui/routines",
                     "/ui/schedules", "/ui/work"):  # fmt: skip
            page = viewer.get(path)
            assert page.status_code == 200, path
            assert not _ACTION_FORM.search(page.text), path
        detail = viewer.get(f"/ui/work/{deploy}").text
        assert 'id="view-only"' in detail
        assert "watcher · viewer" in detail
        # A forged action with the session's own CSRF token: refused by role, nothing changes.
        for path, fields in ((f"/ui/work/{deploy}/approve", {}),
                             (f"/ui/work/{deploy}/cancel", {}),
                             ("/ui/schedules/conduit:nightly/pause", {}),
                             ("/ui/work/bulk", {"action": "cancel", "target": "filter",
                                                "filter": "status=held", "confirm": "1"})):  # fmt: skip
            forged = viewer.post(path, fields)
            assert forged.status_code == 403, path
            assert "forbidden_role" in forged.text
        assert daemon.show(deploy).work.status == "held"
        assert "paused" not in daemon.cli("routines", "list").stdout
        # The API's bulk action too: a viewer's token is refused by role, nothing done.
        status, body = daemon.raw("POST", "/v1/work/bulk/cancel",
                                  b'{"filter": {"status": "held"}}', token=VIEWER)  # fmt: skip
        assert status == 403
        assert body["code"] == "forbidden_role"
        assert daemon.show(deploy).work.status == "held"
    finally:
        viewer.close()

    # The operator sees Approve (not Confirm stopped, an admin's) and its approval is recorded.
    operator = Console(daemon)
    try:
        assert operator.login(OPERATOR).status_code == 303
        card = operator.get("/ui/").text
        assert f"/ui/work/{deploy}/approve" in card
        assert operator.post(f"/ui/work/{deploy}/approve", {"reason": "fine"}).status_code == 303
        daemon.wait_status(deploy, "completed")
        inputs = operator.get(f"/ui/work/{deploy}").text
        assert '<span class="muted actor">by default</span>' in inputs  # the submit's token
    finally:
        operator.close()
    released = [e for e in events(daemon.store, deploy) if e.type == "core.gate.released"]
    assert [e.actor for e in released] == ["ops"]
    assert "console login token=ops role=operator" in daemon.log()


def test_wrong_tokens_at_the_login_are_throttled(console: Console) -> None:
    for n in range(10):
        assert console.login(f"guess-{n}").status_code == 401
    throttled = console.login()  # even the right token, until the block ends
    assert throttled.status_code == 429
    assert 1 <= int(throttled.headers["retry-after"]) <= 30
    assert "too many wrong tokens" in throttled.text
    log = console.daemon.log()
    assert "console login refused: wrong token from 127.0.0.1" in log
    assert "guess-" not in log


def test_a_viewer_in_chromium_has_no_buttons_and_a_forged_post_is_refused(
    console_daemon: Callable[..., Daemon], tmp_path: Path, browser: object  # noqa: F811
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    from tests.console._live import live_wait

    assert isinstance(browser, WebDriver)
    driver = browser
    daemon = _start(console_daemon, tmp_path)
    deploy = daemon.submit("deploy")
    daemon.wait_status(deploy, "held")
    base = f"http://127.0.0.1:{daemon.port}"
    wait = live_wait(driver)
    driver.get(f"{base}/ui/login")
    driver.find_element(By.ID, "token").send_keys(VIEWER)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: d.current_url == f"{base}/ui/")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'[data-work="{deploy}"]'))
    for path in ("/ui/", f"/ui/work/{deploy}", "/ui/routines"):
        driver.get(base + path)
        wait.until(lambda d: d.find_elements(By.ID, "who"))
        buttons = [b.text for b in driver.find_elements(By.CSS_SELECTOR, "main button")]
        assert buttons == [], (path, buttons)
        assert driver.find_element(By.ID, "who").text == "watcher · viewer"
    # A forged POST from the page itself (same origin, the session's CSRF token): 403.
    status = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const csrf = document.querySelector('input[name="csrf"]').value;
        fetch(arguments[0], {method: 'POST', body: new URLSearchParams({csrf: csrf}),
                             redirect: 'manual'}).then(r => done(r.status));
        """,
        f"/ui/work/{deploy}/approve",
    )
    assert status == 403
    wait_for("the Work to stay held", lambda: daemon.show(deploy).work.status == "held" or None)
    assert daemon.runs(deploy) == 0


def test_bulk_approve_and_refuse_of_held_work_record_the_operator(
    console_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    import msgspec

    daemon = _start(console_daemon, tmp_path)
    held = [daemon.submit("deploy", id=f"deploy-{n}") for n in range(3)]
    for work_id in held:
        daemon.wait_status(work_id, "held")

    def bulk(action: str, **body: object) -> dict[str, object]:
        status, answer = daemon.raw("POST", f"/v1/work/bulk/{action}", msgspec.json.encode(body),
                                    token=OPERATOR)  # fmt: skip
        assert status == 200, answer
        return answer

    refused = bulk("refuse", ids=[held[0]], reason="not today")
    assert refused["results"] == [{"id": held[0], "ok": True, "status": "cancelled",
                                   "code": None, "error": None}]  # fmt: skip
    dry = bulk("approve", filter={"status": "held", "binding": "deploy"}, dry_run=True)
    assert dry["matched"] == 2
    approved = bulk("approve", filter={"status": "held", "binding": "deploy"}, reason="go")
    assert approved["succeeded"] == 2
    assert approved["actor"] == "ops"
    for work_id in held[1:]:
        daemon.wait_status(work_id, "completed")
    # An unknown id fails alone with its code.
    again = bulk("approve", ids=["nope"])
    assert again["failed"] == 1
    assert again["results"][0]["code"] == "not_found"  # type: ignore[index]
    gate = [e for w in held for e in events(daemon.store, w) if e.type.startswith("core.gate.")]
    assert {e.actor for e in gate if e.type != "core.gate.held"} == {"ops"}
