"""The console over HTTP against a real daemon: login, sessions, CSRF, escaping, refusals.

Each write test shows its negative control: the same request with the protection satisfied
does change the Work, so a refusal is the protection at work, not an action that never works.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable

import pytest

from tests.console.conftest import Console
from tests.daemon.conftest import Daemon, wait_for


def _logged_in(console: Console) -> Console:
    assert console.login().status_code == 303
    return console


def test_pages_need_a_login_and_the_token_buys_an_httponly_strict_cookie(console: Console) -> None:
    for path in ("/ui/", "/ui/work", "/ui/routines", "/ui/schedules", "/ui/capacity"):
        answer = console.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"] == "/ui/login"
    assert console.get("/ui").headers["location"] == "/ui/"

    wrong = console.login("not-the-token")
    assert wrong.status_code == 401
    assert "set-cookie" not in wrong.headers
    assert "wrong token" in wrong.text
    assert console.get("/ui/").status_code == 303  # still logged out

    right = console.login()
    assert right.status_code == 303
    assert right.headers["location"] == "/ui/"
    cookie = right.headers["set-cookie"]
    assert cookie.startswith("conduit_session=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/ui" in cookie
    assert console.daemon.token not in cookie  # the cookie is a session id, never the token
    page = console.get("/ui/")
    assert page.status_code == 200
    assert "Needs you" in page.text

    # A logout ends the session on the server: the old cookie is worth nothing afterwards.
    stolen = console.http.cookies.get("conduit_session")
    assert console.post("/ui/logout").status_code == 303
    console.http.cookies.set("conduit_session", stolen or "", path="/ui")
    assert console.get("/ui/").status_code == 303


def test_api_stays_behind_its_bearer_token_and_a_session_cookie_does_not_open_it(
    console: Console,
) -> None:
    _logged_in(console)
    # The cookie is scoped to /ui and the API checks only the bearer header.
    assert console.get("/v1/health").status_code == 401
    assert console.get("/uix").status_code == 401  # not a console path: the API's 401
    assert console.daemon.raw("GET", "/v1/health")[0] == 200


def test_every_answer_carries_a_strict_content_security_policy(console: Console) -> None:
    _logged_in(console)
    for path in ("/ui/login", "/ui/", "/ui/work", "/ui/static/htmx.min.js", "/ui/nope"):
        headers = console.get(path).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp, path
        assert "unsafe-inline" not in csp
        assert "unsafe-eval" not in csp
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
    assert console.get("/ui/nope").status_code == 404
    assert console.get("/ui/static/../token").status_code == 404


def test_a_write_without_the_csrf_token_is_refused_and_changes_nothing(console: Console) -> None:
    _logged_in(console)
    work = console.daemon.submit("forever")
    console.daemon.wait_attempt(work, "running")
    path = f"/ui/work/{work}/cancel"

    missing = console.post(path, {"reason": "x"}, csrf=None)
    assert missing.status_code == 403
    assert "csrf_failed" in missing.text
    wrong = console.post(path, {"reason": "x"}, csrf="forged-token")
    assert wrong.status_code == 403
    # The right token from another site's page: the Origin gives it away.
    cross = console.post(path, {"reason": "x"}, headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403
    # A browser that marks the request cross-site (Sec-Fetch-Site) is refused the same way.
    marked = console.post(path, {"reason": "x"}, headers={"Sec-Fetch-Site": "cross-site"})
    assert marked.status_code == 403
    assert console.daemon.show(work).work.status == "running"
    # No session at all: 401, whatever the form says.
    anonymous = Console(console.daemon)
    try:
        refused = anonymous.post(path, {"reason": "x"}, csrf=console.csrf())
        assert refused.status_code == 401
        assert "unauthorized" in refused.text
    finally:
        anonymous.close()
    assert console.daemon.show(work).work.status == "running"

    # Negative control: the same request with the session's token cancels the running job.
    done = console.post(path, {"reason": "from the console", "next": f"/ui/work/{work}"})
    assert done.status_code == 303
    assert done.headers["location"] == f"/ui/work/{work}"
    assert console.daemon.show(work).work.status == "cancelled"
    page = console.get(f"/ui/work/{work}")
    assert f"cancel requested for {work}" in page.text  # the flash, shown once
    assert f"cancel requested for {work}" not in console.get(f"/ui/work/{work}").text


def test_an_action_after_redirects_only_within_the_console(console: Console) -> None:
    _logged_in(console)
    work = console.daemon.submit("forever")
    answer = console.post(f"/ui/work/{work}/cancel", {"next": "https://evil.example/x"})
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/ui/work/{work}"
    other = console.daemon.submit("forever")
    answer = console.post(f"/ui/work/{other}/cancel", {"next": "//evil.example/x"})
    assert answer.headers["location"] == f"/ui/work/{other}"


def test_refusals_are_coded_pages_with_the_api_status_and_store_nothing(console: Console) -> None:
    _logged_in(console)
    deploy = console.daemon.submit("deploy")
    wait_for("the deploy to be held", lambda: console.daemon.show(deploy).work.status == "held")

    # Refusing needs a reason.
    no_reason = console.post(f"/ui/work/{deploy}/refuse", {"reason": "  "})
    assert no_reason.status_code == 400
    assert "invalid_body" in no_reason.text
    assert "reason" in no_reason.text
    # A reason over the API's limit is refused naming the field, as POST /v1/... would.
    too_long = console.post(f"/ui/work/{deploy}/cancel", {"reason": "x" * 1001})
    assert too_long.status_code == 400
    assert "$.reason" in html.unescape(too_long.text)
    # Confirm-stopped with a bad epoch names the field.
    bad_epoch = console.post(f"/ui/work/{deploy}/confirm-stopped", {"epoch": "one"})
    assert bad_epoch.status_code == 400
    assert "epoch" in bad_epoch.text
    # A payload that is not JSON names its field and the code.
    not_json = console.post(f"/ui/work/{deploy}/inject", {"payload": "{oops"})
    assert not_json.status_code == 400
    assert "invalid_json" in not_json.text
    # An unknown Work and an unknown action are 404s.
    assert console.post("/ui/work/no-such-work/cancel").status_code == 404
    assert console.post(f"/ui/work/{deploy}/explode").status_code == 404
    assert console.get("/ui/work/no-such-work").status_code == 404
    # Retry of held Work is not eligible: 409, the API's code.
    retry = console.post(f"/ui/work/{deploy}/retry")
    assert retry.status_code == 409
    assert "not_eligible" in retry.text
    # Nothing changed: still held, never ran.
    assert console.daemon.show(deploy).work.status == "held"
    assert console.daemon.runs(deploy) == 0

    # Negative control: a refusal with a reason cancels it.
    assert console.post(f"/ui/work/{deploy}/refuse", {"reason": "not today"}).status_code == 303
    assert console.daemon.show(deploy).work.status == "cancelled"


def test_needs_you_lists_the_gate_hold_with_why_and_approve_runs_it(console: Console) -> None:
    _logged_in(console)
    deploy = console.daemon.submit("deploy")
    wait_for("the deploy in needs-you", lambda: deploy in console.get("/ui/").text)
    page = console.get("/ui/").text
    # Why, escaped: the gate's reason holds markup, shown as text.
    assert "deploys need a person &lt;b&gt;now&lt;/b&gt;" in page
    assert "<b>now</b>" not in page
    assert f'action="/ui/work/{deploy}/approve"' in page
    assert f'action="/ui/work/{deploy}/refuse"' in page
    assert console.get("/ui/needs-you/count").text.strip() == "1"

    assert console.post(f"/ui/work/{deploy}/approve", {"reason": "ok", "next": "/ui/"}
                        ).headers["location"] == "/ui/"  # fmt: skip
    console.daemon.wait_status(deploy, "completed")
    assert console.daemon.runs(deploy) == 1
    assert f'data-work="{deploy}"' not in console.get("/ui/").text
    assert console.get("/ui/needs-you/count").text.strip() == "0"


def test_job_output_and_inputs_are_escaped_and_viewable(console: Console) -> None:
    _logged_in(console)
    payload = {"note": "<script>alert('input')</script>"}
    work = console.daemon.submit("loud", input=payload)
    console.daemon.wait_status(work, "completed")
    page = console.get(f"/ui/work/{work}").text
    assert "<script>alert(" not in page
    assert "&lt;script&gt;alert(" in page  # the input payload, as text
    links = re.findall(rf'href="(/ui/work/{work}/artifacts/1/\w+)"', page)
    assert sorted(links) == [f"/ui/work/{work}/artifacts/1/stderr",
                             f"/ui/work/{work}/artifacts/1/stdout"]  # fmt: skip
    stdout = console.get(f"/ui/work/{work}/artifacts/1/stdout").text
    assert "&lt;img src=x onerror=alert(1)&gt;" in stdout
    assert "<img src=x" not in stdout
    assert "<script>alert(2)" not in stdout
    stderr = console.get(f"/ui/work/{work}/artifacts/1/stderr").text
    assert "&amp;amp; &lt;b&gt;bold&lt;/b&gt;" in stderr
    # Only artifacts an attempt's result names are served.
    assert console.get(f"/ui/work/{work}/artifacts/1/token").status_code == 404
    assert console.get(f"/ui/work/{work}/artifacts/9/stdout").status_code == 404


def test_a_run_environment_value_is_never_shown(console: Console) -> None:
    _logged_in(console)
    work = console.daemon.submit("envjob")
    console.daemon.wait_status(work, "completed")
    # Positive control: the job did get the test plugin's run environment.
    assert (console.daemon.root / "env.seen").exists()
    pages = [
        "/ui/", "/ui/work", f"/ui/work/{work}", f"/ui/work/{work}/live",
        f"/ui/work/{work}/artifacts/1/stdout", f"/ui/work/{work}/artifacts/1/stderr",
        "/ui/capacity", "/ui/schedules", "/ui/routines",
    ]  # fmt: skip
    for path in pages:
        answer = console.get(path)
        assert answer.status_code == 200, path
        assert "from-test-plugin" not in answer.text, path


def test_work_list_filters_by_status_scope_and_binding_and_pages(console: Console) -> None:
    _logged_in(console)
    daemon = console.daemon
    oks = [daemon.submit("ok") for _ in range(3)]
    team = daemon.submit("ok", scope="team")
    held = daemon.submit("deploy")
    for work in [*oks, team]:
        daemon.wait_status(work, "completed")
    wait_for("the deploy to be held", lambda: daemon.show(held).work.status == "held")

    def ids(query: str) -> list[str]:
        answer = console.get(f"/ui/work/rows?{query}")
        assert answer.status_code == 200, answer.text
        return re.findall(r'<tr data-work="([^"]+)"', answer.text)

    assert ids("binding=deploy") == [held]
    assert ids("status=held") == [held]
    assert ids("scope=team") == [team]
    # Newest first by default (ids here grow with time), oldest first on request.
    assert ids("binding=ok&status=completed") == sorted([*oks, team], reverse=True)
    assert ids("binding=ok&status=completed&order=oldest") == sorted([*oks, team])
    assert ids("binding=ok&scope=team") == [team]
    first = console.get("/ui/work?binding=ok&limit=25").text
    assert "next page" not in first
    # A bad filter is a coded refusal naming the parameter.
    bad = console.get("/ui/work?status=bogus")
    assert bad.status_code == 400
    assert "invalid_status" in bad.text
    assert "bogus" in bad.text
    bad = console.get(f"/ui/work?after={oks[0]}")  # a Work id is not a page cursor
    assert bad.status_code == 400
    assert "invalid_cursor" in bad.text
    assert console.get("/ui/work?limit=7").status_code == 400
    # The same binding filter over the API and in the CLI.
    status, body = daemon.raw("GET", "/v1/work?binding=deploy")
    assert status == 200
    assert [w["id"] for w in body["items"]] == [held]
    listed = json.loads(daemon.cli("work", "list", "--binding", "deploy", "--json").stdout)
    assert [w["id"] for w in listed["items"]] == [held]


def test_routines_pause_resume_run_now_and_show_next_fire_in_their_timezone(
    console_daemon: Callable[..., Daemon],
) -> None:
    start = console_daemon
    daemon = start()
    daemon.cli("routines", "add", "nightly", "--cron", "0 3 * * *", "--binding", "ok",
               "--timezone", "Asia/Tokyo")  # fmt: skip
    console = Console(daemon)
    try:
        _logged_in(console)
        page = wait_for("the Routine listed",
                        lambda: "nightly" in (t := console.get("/ui/routines").text) and t)  # fmt: skip
        assert re.search(r"\d{4}-\d\d-\d\d 03:00:00 Asia/Tokyo", page)
        pause = console.post("/ui/schedules/conduit:nightly/pause", {"next": "/ui/routines"})
        assert pause.status_code == 303
        assert "paused" in daemon.cli("routines", "list").stdout
        resume = console.post("/ui/schedules/conduit%3Anightly/resume")
        assert resume.status_code == 303
        assert "paused" not in daemon.cli("routines", "list").stdout
        run = console.post("/ui/schedules/conduit:nightly/run", {"next": "/ui/routines/nightly"})
        assert run.headers["location"] == "/ui/routines/nightly"
        history = wait_for(
            "the fire in the history",
            lambda: "completed" in (t := console.get("/ui/routines/nightly").text) and t,
        )
        assert 'href="/ui/work/' in history
        # An observe-only source's schedule cannot be changed from the console either.
        ro = console.post("/ui/schedules/test-remote:nightly/pause")
        assert ro.status_code == 403
        assert "read_only_source" in ro.text
        assert console.get("/ui/routines/no-such").status_code == 404
    finally:
        console.close()


def test_schedules_show_an_unavailable_source_as_such(
    console_daemon: Callable[..., Daemon],
) -> None:
    start = console_daemon
    console = Console(start(env={"CONDUIT_TEST_REMOTE_DOWN": "1"}))
    try:
        _logged_in(console)
        page = console.get("/ui/schedules")
        assert page.status_code == 200
        row = re.search(r'<tr class="source degraded" data-source="test-remote">.*?</tr>',
                        page.text, re.S)  # fmt: skip
        assert row, page.text
        assert "unavailable" in row.group(0)
        assert "connection refused" in row.group(0)
        # The other sources still answer.
        assert 'data-source="conduit"' in page.text
    finally:
        console.close()


@pytest.mark.parametrize(
    "path", ["/ui/work/rows", "/ui/work/x/live", "/ui/needs-you/count", "/ui/needs-you/list"]
)
def test_a_poll_without_a_session_asks_htmx_to_go_to_the_login(console: Console, path: str) -> None:
    answer = console.get(path, headers={"HX-Request": "true"})
    assert answer.status_code == 401
    assert answer.headers["hx-redirect"] == "/ui/login"


def test_capacity_page_says_what_the_api_says(console: Console) -> None:
    console.login()
    daemon = console.daemon
    work = daemon.submit("forever", scope="team")
    daemon.wait_attempt(work, "running")
    status, api = daemon.raw("GET", "/v1/capacity")
    assert status == 200
    page = console.get("/ui/capacity/live").text
    for kind, rows in (("pool", api["pools"]), ("scope", api["scopes"])):
        for row in rows:
            cells = re.search(rf'<tr data-{kind}="{row["name"]}">(.*?)</tr>', page, re.S)
            assert cells, (kind, row["name"])
            limit = "-" if row["limit"] is None else str(row["limit"])
            expected = [f"{kind} {row['name']}", str(row["in_use"]), limit, str(row["waiting"])]
            assert re.findall(r"<td>(.*?)</td>", cells.group(1)) == expected
    jobs = next(p for p in api["pools"] if p["name"] == "jobs")
    team = next(s for s in api["scopes"] if s["name"] == "team")
    assert (jobs["in_use"], jobs["limit"], team["in_use"], team["limit"]) == (1, 4, 1, 2)


def test_capacity_page_lists_the_daemons_on_the_store(console: Console) -> None:
    console.login()
    status, api = console.daemon.raw("GET", "/v1/daemons")
    assert status == 200
    (row,) = api["daemons"]
    page = console.get("/ui/capacity/live").text
    cells = re.search(rf'<tr data-daemon="{re.escape(row["id"])}">(.*?)</tr>', page, re.S)
    assert cells, page
    assert re.findall(r"<td>(.*?)</td>", cells.group(1))[:5] == [
        row["id"], row["host"], "-", "running", str(row["load"])
    ]


def test_a_work_page_shows_its_priority_and_key_escaped_and_what_it_waits_for(
    console_daemon: Callable[..., Daemon],
) -> None:
    """A Work waiting for its concurrency key shows the key (escaped: it comes from the input),
    its limit, its priority and the waiting reason."""
    more = """
[bindings.per-customer]
executor = "shell"
concurrency_key = "{customer}"
config = { command = 'sleep 300', stop_grace_seconds = 1 }
"""
    console = Console(console_daemon(more=more))
    try:
        _logged_in(console)
        key = "<b>acme</b>"
        first = console.daemon.submit("per-customer", input={"customer": key}, priority=2)
        console.daemon.wait_status(first, "running")
        second = console.daemon.submit("per-customer", input={"customer": key})
        wait_for("the second to wait for its key", lambda: (
            (w := console.daemon.show(second).waiting) is not None
            and w.code == "concurrency_key"))  # fmt: skip
        page = console.get(f"/ui/work/{second}").text
        assert "<b>acme</b>" not in page
        assert "key <b id=\"work-key\">&lt;b&gt;acme&lt;/b&gt;</b> (at most 1 at once)" in page
        assert "waiting for key" in page
        assert 'priority <b id="work-priority">2</b>' in console.get(f"/ui/work/{first}").text
    finally:
        console.close()


def test_a_waiting_dependent_shows_what_it_waits_for(console: Console) -> None:
    daemon = console.daemon
    daemon.submit("held", id="dep-a")
    daemon.submit("ok", id="dep-b", after=["dep-a"])
    console.login()
    page = console.get("/ui/work/dep-b/live").text
    assert "waiting for work dep-a" in page
    assert 'href="/ui/work/dep-a"' in page
    assert "on failure: cancel" in page
