"""``GET /metrics`` of a real daemon, parsed with prometheus_client's own parser.

Every value asserted is compared with what the store says through the API (``/v1/work``,
``/v1/capacity``, ``needs-you``), not with a number the test made up: a counter that double
counts, a gauge that reads the wrong table or a missing label shows as a mismatch.
"""

from __future__ import annotations

import http.client
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conduit_core.http import CapacityView, WorkDetail, WorkPage
from tests.daemon.conftest import Daemon, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

DEPLOY = """
[bindings.deploy]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}' }}
"""


def scrape(daemon: Daemon, token: str | None = "default") -> tuple[int, str, str]:
    """(status, content type, body) of ``GET /metrics``."""
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {daemon.token if token == 'default' else token}"
    conn.request("GET", "/metrics", headers=headers)
    reply = conn.getresponse()
    body = reply.read().decode()
    conn.close()
    return reply.status, reply.getheader("content-type") or "", body


def samples(daemon: Daemon) -> Samples:
    status, content_type, body = scrape(daemon)
    assert status == 200, body
    assert content_type.startswith("text/plain; version=")
    out: Samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def total(found: Samples, name: str, **labels: str) -> float:
    """Sum over every series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and want <= set(ls))


def all_work(daemon: Daemon) -> list[WorkDetail]:
    page = daemon.api().request("GET", "/v1/work?limit=500", None, WorkPage)
    return [daemon.show(w.id) for w in page.items]


def test_metrics_match_the_store(
    make_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "human.toml"
    rules.write_text('[[rules]]\nbindings = ["deploy"]\nreason = "deploys need a person"\n')
    monkeypatch.setenv("CONDUIT_HUMAN_GATE_CONFIG", str(rules))
    daemon = make_daemon(lease=1.5, extra=DEPLOY.format(side=tmp_path / "side-effects.log"))
    daemon.start()

    done = [daemon.submit("ok") for _ in range(3)]
    failed = daemon.submit("gated")  # no gate file: fails; no retry delays → blocked, not ready
    flaky = daemon.submit("flaky")  # fails once, then completes on its retry
    for work_id in [*done, flaky]:
        daemon.wait_status(work_id, "completed")
    daemon.wait_attempt(failed, "failed")
    running = daemon.submit("held")
    daemon.wait_attempt(running, "running")
    deploy = daemon.submit("deploy")
    daemon.wait_status(deploy, "held")

    # Leases of the running job are renewed every half second: wait for one to be counted.
    wait_for(
        "a lease renewal to be counted",
        lambda: value(samples(daemon), "conduit_lease_renewals_total") >= 1,
    )
    found = samples(daemon)
    works = all_work(daemon)
    capacity = daemon.api().request("GET", "/v1/capacity", None, CapacityView)

    # Attempts started and finished, per binding, executor and outcome, as the store has them.
    attempts = [a for w in works for a in w.attempts]
    ended = Counter((a.binding, a.executor, str(a.status)) for a in attempts if a.ended_at_ms)
    assert ended == {
        ("ok", "shell", "completed"): 3,
        ("gated", "shell", "failed"): 1,
        ("flaky", "shell", "failed"): 1,
        ("flaky", "shell", "completed"): 1,
    }
    for (binding, executor, outcome), count in ended.items():
        labels = {"binding": binding, "executor": executor, "outcome": outcome}
        assert value(found, "conduit_attempts_finished_total", **labels) == count, labels
        assert value(found, "conduit_attempt_duration_seconds_count", **labels) == count, labels
    assert total(found, "conduit_attempts_finished_total") == sum(ended.values())
    launched = Counter((a.binding, a.executor) for a in attempts)
    for (binding, executor), count in launched.items():
        labels = {"binding": binding, "executor": executor}
        assert value(found, "conduit_attempts_started_total", **labels) == count, labels
        assert value(found, "conduit_attempt_claim_to_start_seconds_count", **labels) == count
    assert total(found, "conduit_attempts_started_total") == len(attempts) == 7

    # Stored-state gauges: the same numbers as /v1/capacity, /v1/work and needs-you.
    for pool in capacity.pools:
        assert value(found, "conduit_pool_slots_in_use", pool=pool.name) == pool.in_use
        if pool.limit is not None:
            assert value(found, "conduit_pool_slots_limit", pool=pool.name) == pool.limit
    jobs = next(p for p in capacity.pools if p.name == "jobs")
    assert (jobs.in_use, jobs.limit) == (1, 4)  # the running job; job_concurrency = 4
    for scope in capacity.scopes:
        assert value(found, "conduit_scope_slots_in_use", scope=scope.name) == scope.in_use
        assert value(found, "conduit_scope_slots_limit", scope=scope.name) == scope.limit
    # The ready Work whose retries are spent counts as `exhausted` (its listed state).
    statuses = Counter(w.work.state for w in works)
    assert statuses == {"completed": 4, "exhausted": 1, "running": 1, "held": 1}
    for status in ("ready", "running", "waiting", "held", "completed", "failed", "cancelled",
                   "exhausted"):  # fmt: skip
        assert value(found, "conduit_work", status=status) == statuses.get(status, 0), status
    assert value(found, "conduit_work_ready") == 0  # the ready one is blocked: not startable
    assert ("conduit_work_ended_counts_age_seconds", ()) in found
    needs = json.loads(daemon.cli("needs-you", "--json").stdout)["items"]
    assert [i["work_id"] for i in needs] == [deploy]
    assert value(found, "conduit_holds", kind="gate") == 1
    assert value(found, "conduit_holds", kind="budget") == 0
    assert value(found, "conduit_holds", kind="recovery") == 0
    assert value(found, "conduit_store_up") == 1

    # Hot-path instruments that have no stored twin still move the right way.
    assert value(found, "conduit_lease_losses_total") == 0
    writes = value(found, "conduit_store_write_seconds_count")
    batched = value(found, "conduit_store_write_batch_size_sum")
    assert writes >= len(attempts) * 2  # at least a claim and a settle per attempt
    # Every write is in exactly one batch. A batch is counted when it is taken and a write when
    # it returns, so a write in flight at the scrape (the running job's lease renewal) is
    # counted in its batch only.
    assert writes <= batched <= writes + 2
    # A batch's time in its store thread is counted when it ends (its size when it is taken),
    # and it is never longer than the wait of any write in it: summed over batches, it is at
    # most the writes' summed latency, and above zero.
    batches = value(found, "conduit_store_write_batch_size_count")
    timed = value(found, "conduit_store_write_batch_seconds_count")
    assert timed <= batches <= timed + 2
    assert 0 < value(found, "conduit_store_write_batch_seconds_sum") <= value(
        found, "conduit_store_write_seconds_sum"
    )

    # Approving the held deploy moves the gauges with the store.
    daemon.cli("approve", deploy)
    daemon.wait_status(deploy, "completed")
    after = samples(daemon)
    assert value(after, "conduit_holds", kind="gate") == 0
    assert value(after, "conduit_work", status="completed") == 5
    labels = {"binding": "deploy", "executor": "shell", "outcome": "completed"}
    assert value(after, "conduit_attempts_finished_total", **labels) == 1

    # A full pool: the fifth job waits, ready and startable, counted as waiting for "jobs".
    more = [daemon.submit("held") for _ in range(4)]

    def full() -> CapacityView | None:
        view = daemon.api().request("GET", "/v1/capacity", None, CapacityView)
        jobs = next(p for p in view.pools if p.name == "jobs")
        return view if (jobs.in_use, jobs.waiting) == (4, 1) else None

    wait_for("the jobs pool to be full with one waiting", full)
    found = samples(daemon)
    assert value(found, "conduit_work_ready") == 1
    assert value(found, "conduit_pool_waiting", pool="jobs") == 1
    assert value(found, "conduit_pool_slots_in_use", pool="jobs") == 4
    for work_id in [running, *more]:
        daemon.release(work_id)
    for work_id in [running, *more]:
        daemon.wait_status(work_id, "completed")
    assert value(samples(daemon), "conduit_work_ready") == 0


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_metrics_want_the_token_unless_configured_open(
    make_daemon: Callable[..., Daemon],
) -> None:
    guarded = make_daemon().start()
    status, _, body = scrape(guarded, token=None)
    assert status == 401
    assert json.loads(body)["code"] == "unauthorized"
    assert scrape(guarded, token="wrong")[0] == 401
    assert scrape(guarded)[0] == 200

    opened = make_daemon(settings_extra="metrics.open = true").start()
    status, _, body = scrape(opened, token=None)
    assert status == 200
    assert "# TYPE conduit_attempts_started_total counter" in body
    # Open metrics open nothing else: the API still wants the token.
    assert opened.raw("GET", "/v1/health", token=None)[0] == 401


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_recovery_after_a_killed_daemon_is_counted_as_adopted(
    make_daemon: Callable[..., Daemon],
) -> None:
    first = make_daemon(lease=1.5).start()
    work_id = first.submit("held")
    first.wait_attempt(work_id, "running")
    first.kill()  # the job runs on, detached; its lease lapses

    second = make_daemon(lease=1.5).start()
    wait_for(
        "the new daemon to adopt the job",
        lambda: value(samples(second), "conduit_recoveries_total", result="adopted") == 1,
    )
    found = samples(second)
    assert value(found, "conduit_recoveries_total", result="relaunched") == 0
    assert value(found, "conduit_recoveries_total", result="held") == 0
    second.release(work_id)
    detail = second.wait_status(work_id, "completed")
    assert [a.attempt for a in detail.attempts] == [1]  # adopted, never started twice
    assert second.runs(work_id, "start") == 1
    labels = {"binding": "held", "executor": "shell", "outcome": "completed"}
    assert value(samples(second), "conduit_attempts_finished_total", **labels) == 1
    assert (
        value(samples(second), "conduit_attempts_started_total", binding="held", executor="shell")
        == 0
    )  # started by the first daemon, not this one


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_daemon_traces_attempts_only_when_configured(make_daemon: Callable[..., Daemon]) -> None:
    traced = make_daemon(
        settings_extra='tracing.enabled = true\ntracing.exporter = "console"\n'
        'tracing.service_name = "conduit-test"'
    ).start()
    work_id = traced.submit("ok")
    traced.wait_status(work_id, "completed")
    execution_id = traced.show(work_id).attempts[0].id

    def attempt_span() -> bool:
        text = traced.log()
        return '"name": "conduit.attempt"' in text and execution_id in text

    wait_for("the attempt span on the console exporter", attempt_span)
    text = traced.log()
    assert '"name": "conduit.segment"' in text
    assert '"service.name": "conduit-test"' in text
    assert '"conduit.binding": "ok"' in text

    # Negative control: the same daemon without [settings.tracing] prints no span.
    plain = make_daemon().start()
    other = plain.submit("ok")
    plain.wait_status(other, "completed")
    assert "conduit.attempt" not in plain.log()


ALERTS = Path(__file__).resolve().parents[2] / "docs" / "alerts.example.yml"


def served_names(body: str) -> set[str]:
    """Every series name ``/metrics`` serves, a labelled family without samples included."""
    names: set[str] = set()
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names.update(f"{name}_{suffix}" for suffix in ("bucket", "count", "sum"))
        elif line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names


def test_alert_ready_metrics_and_the_example_rules(make_daemon: Callable[..., Daemon]) -> None:
    import re
    import time

    import yaml

    daemon = make_daemon(job_concurrency=1).start()
    running = daemon.submit("held")
    daemon.wait_attempt(running, "running")
    before = time.time()
    waiting = [daemon.submit("held") for _ in range(2)]  # the only jobs slot is taken: they wait

    # The queue per binding: its depth, and the age of its oldest startable Work, growing.
    def aged() -> Samples | None:
        found = samples(daemon)
        age = value(found, "conduit_work_ready_oldest_age_seconds", binding="held")
        return found if age >= 1.0 else None

    found = wait_for("the oldest ready Work to be a second old", aged)
    assert value(found, "conduit_work_ready_depth", binding="held", pool="jobs") == 2
    age = value(found, "conduit_work_ready_oldest_age_seconds", binding="held")
    assert 1.0 <= age <= time.time() - before + 1.0
    assert ("conduit_work_ready_oldest_age_seconds", (("binding", "ok"),)) in found
    assert value(found, "conduit_work_ready_oldest_age_seconds", binding="ok") == 0
    assert value(found, "conduit_attempts_held", reason="recovery") == value(
        found, "conduit_holds", kind="recovery"
    )
    assert ("conduit_attempts_held", (("reason", "stop_unconfirmed"),)) in found

    # A Routine's fire, labelled by its id.
    daemon.cli("routines", "add", "nightly", "--cron", "0 3 * * *", "--binding", "echo")
    # Through the API: the daemon's ticker is poked at once (a CLI write waits for its recheck).
    assert daemon.raw("POST", "/v1/schedules/conduit:nightly/run")[0] == 202
    wait_for(
        "the fire to be counted",
        lambda: value(samples(daemon), "conduit_routine_fires_total", routine="nightly",
                      outcome="fired") == 1 or None,
    )  # fmt: skip

    # Insert -> start: each started Work observed once in the wait histogram.
    for work_id in [running, *waiting]:
        daemon.release(work_id)
    for work_id in [running, *waiting]:
        daemon.wait_status(work_id, "completed")
    found = samples(daemon)
    assert value(found, "conduit_work_submit_to_start_seconds_count", binding="held") == 3
    assert value(found, "conduit_work_ready_depth", binding="held", pool="jobs") == 0
    assert value(found, "conduit_work_ready_oldest_age_seconds", binding="held") == 0

    # The example alert rules parse, and every conduit series they name is served.
    rules = yaml.safe_load(ALERTS.read_text())
    named: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert {"alert", "expr", "labels", "annotations"} <= set(rule), rule
            assert rule["labels"]["severity"] in ("page", "ticket")
            named.update(re.findall(r"\bconduit_[a-z_]+", rule["expr"]))
    assert len(named) >= 10
    status, _, body = scrape(daemon)
    assert status == 200
    missing = named - served_names(body)
    assert not missing, f"alert rules name series /metrics does not serve: {sorted(missing)}"
