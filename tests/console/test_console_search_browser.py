"""Work search and bulk actions in Chromium (Selenium), as an operator uses them: a search typed
in the filter form becomes a deep link that gives the same rows when opened afresh; a bulk retry
of every exhausted Work shows its dry-run count before it runs, then each Work's result.
Screenshots go to ``$CONDUIT_ARTIFACTS/console/`` like the main walk's."""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from tests.console.test_console_browser import _artifacts, browser  # noqa: F401 (a fixture)
from tests.daemon.conftest import Daemon, wait_for


def _login(driver: object, daemon: Daemon) -> tuple[str, object]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    from tests.console._live import live_wait

    assert isinstance(driver, WebDriver)
    base = f"http://127.0.0.1:{daemon.port}"
    wait = live_wait(driver)
    driver.get(f"{base}/ui/login")
    driver.find_element(By.ID, "token").send_keys(daemon.token)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: d.current_url == f"{base}/ui/")
    return base, wait


def _rows(driver: object) -> list[str]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(driver, WebDriver)
    return [str(r.get_attribute("data-work"))
            for r in driver.find_elements(By.CSS_SELECTOR, "#work-rows tr[data-work]")]  # fmt: skip


def test_a_search_is_a_deep_link_in_chromium(
    console_daemon: Callable[..., Daemon], browser: object  # noqa: F811
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import Select

    assert isinstance(browser, WebDriver)
    driver = browser
    daemon = console_daemon()
    orders = []
    for n in range(6):
        orders.append(daemon.submit("ok", id=f"order-{n}",
                                    input={"customer": "acme" if n % 2 else "globex"}))  # fmt: skip
        time.sleep(0.002)
    for work_id in orders:
        daemon.wait_status(work_id, "completed")
    base, wait = _login(driver, daemon)
    driver.get(f"{base}/ui/work")
    wait.until(lambda d: _rows(d)[:6] == list(reversed(orders)))  # newest first
    # Type a search: the first input's customer, oldest first, one binding.
    driver.find_element(By.ID, "f-input").send_keys("customer=acme")
    Select(driver.find_element(By.ID, "f-order")).select_by_value("oldest")
    Select(driver.find_element(By.ID, "f-binding")).select_by_value("ok")
    driver.find_element(By.ID, "f-apply").click()
    acme = orders[1::2]
    wait.until(lambda d: _rows(d) == acme)
    # The URL is the API's query: a deep link.
    query = parse_qs(urlsplit(driver.current_url).query)
    assert query["input.customer"] == ["acme"]
    assert query["order"] == ["oldest"]
    assert query["binding"] == ["ok"]
    link = driver.current_url
    driver.save_screenshot(str(_artifacts() / "20-work-search.png"))
    # Opened afresh (another tab would do the same), the link gives the same rows and form.
    driver.get(f"{base}/ui/")
    driver.get(link)
    wait.until(lambda d: _rows(d) == acme)
    assert driver.find_element(By.ID, "f-input").get_attribute("value") == "customer=acme"
    # The rows' live refresh keeps the filter: still the same rows after two polls.
    driver.execute_script(
        "window.polls = 0; document.body.addEventListener('htmx:afterRequest', e => {"
        " if (e.detail.successful && e.detail.pathInfo.requestPath.startsWith('/ui/work/rows'))"
        " window.polls++; });"
    )
    wait.until(lambda d: int(d.execute_script("return window.polls")) >= 2)
    assert _rows(driver) == acme
    # An id prefix and a bad time, as deep links: a coded refusal naming the parameter.
    driver.get(f"{base}/ui/work?id_prefix=order-4")
    wait.until(lambda d: _rows(d) == ["order-4"])
    driver.get(f"{base}/ui/work?since=yesterday")
    wait.until(lambda d: "invalid_time" in d.page_source and "since" in d.page_source)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
              and "400" not in e["message"]]  # fmt: skip
    assert errors == [], errors


def test_bulk_retry_shows_its_dry_run_count_then_each_result_in_chromium(
    console_daemon: Callable[..., Daemon], browser: object  # noqa: F811
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import Select

    assert isinstance(browser, WebDriver)
    driver = browser
    daemon = console_daemon()
    failed = [daemon.submit("gated", id=f"gate-{n}") for n in range(3)]
    for work_id in failed:
        wait_for(f"{work_id} exhausted", lambda w=work_id: daemon.show(w).work.blocked_reason)
    base, wait = _login(driver, daemon)
    driver.get(f"{base}/ui/work?status=exhausted")
    wait.until(lambda d: sorted(_rows(d)) == sorted(failed))
    assert {e.text for e in driver.find_elements(By.CSS_SELECTOR, "#work-rows .status")} == {
        "exhausted"
    }
    # A selected row stays selected across the list's live refresh.
    driver.find_element(By.ID, f"pick-{failed[0]}").click()
    driver.execute_script(
        "window.polls = 0; document.body.addEventListener('htmx:afterRequest', e => {"
        " if (e.detail.successful && e.detail.pathInfo.requestPath.startsWith('/ui/work/rows'))"
        " window.polls++; });"
    )
    wait.until(lambda d: int(d.execute_script("return window.polls")) >= 2)
    assert driver.find_element(By.ID, f"pick-{failed[0]}").is_selected()
    # Preview a retry of the one selected row: the count is 1.
    Select(driver.find_element(By.ID, "bulk-action")).select_by_value("retry")
    driver.find_element(By.ID, "bulk-preview").click()
    wait.until(lambda d: d.find_element(By.ID, "bulk-count"))
    assert driver.find_element(By.ID, "bulk-count").text.startswith("1 Work selected")
    # Back; now everything matching the filter: the dry run counts 3 and nothing changes yet.
    driver.get(f"{base}/ui/work?status=exhausted")
    wait.until(lambda d: sorted(_rows(d)) == sorted(failed))
    Select(driver.find_element(By.ID, "bulk-target")).select_by_value("filter")
    Select(driver.find_element(By.ID, "bulk-action")).select_by_value("retry")
    driver.find_element(By.ID, "bulk-reason").send_keys("gate fixed")
    driver.find_element(By.ID, "bulk-preview").click()
    wait.until(lambda d: d.find_element(By.ID, "bulk-count"))
    assert driver.find_element(By.ID, "bulk-count").text.startswith("3 Work match")
    driver.save_screenshot(str(_artifacts() / "21-bulk-retry-preview.png"))
    assert all(daemon.show(w).work.blocked_reason for w in failed)  # the dry run did nothing
    (daemon.root / "gate").touch()  # the retried jobs now succeed
    confirm = driver.find_element(By.ID, "bulk-confirm")
    assert confirm.text == "Retry 3 Work"
    confirm.click()
    wait.until(lambda d: d.find_element(By.ID, "bulk-summary"))
    assert driver.find_element(By.ID, "bulk-summary").text.startswith("3 done, 0 failed")
    results = driver.find_elements(By.CSS_SELECTOR, "#bulk-results tr[data-work]")
    assert sorted(str(r.get_attribute("data-work")) for r in results) == sorted(failed)
    driver.save_screenshot(str(_artifacts() / "22-bulk-retry-results.png"))
    for work_id in failed:
        daemon.wait_status(work_id, "completed")
        history = daemon.raw("GET", f"/v1/work/{work_id}/history")[1]["items"]
        assert [e["actor"] for e in history if e["reason"] == "gate fixed"] == ["default"]
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
