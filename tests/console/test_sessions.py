"""Console sessions with a controllable clock: the token buys a session, sessions expire, a
logout revokes, and a flood of logins cannot grow memory without bound."""

from __future__ import annotations

from conduit_core.console._session import MAX_SESSIONS, SESSION_SECONDS, Sessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_only_the_token_buys_a_session_and_each_has_its_own_csrf_token() -> None:
    sessions = Sessions("s3cret", clock=Clock())
    assert sessions.login("wrong") is None
    assert sessions.login("") is None
    assert sessions.login("s3cret-and-more") is None
    one, two = sessions.login("s3cret"), sessions.login(" s3cret\n")  # pasted with whitespace
    assert one is not None
    assert two is not None
    assert one.id != two.id
    assert one.csrf != two.csrf
    assert one.csrf_ok(one.csrf)
    assert not one.csrf_ok(two.csrf)
    assert not one.csrf_ok(None)
    assert not one.csrf_ok("")
    assert sessions.get(one.id) is one
    assert sessions.get("made-up") is None
    assert sessions.get(None) is None


def test_a_session_expires_and_a_logout_revokes_it() -> None:
    clock = Clock()
    sessions = Sessions("t", clock=clock)
    session = sessions.login("t")
    other = sessions.login("t")
    assert session is not None
    assert other is not None
    clock.now += SESSION_SECONDS - 1
    assert sessions.get(session.id) is session
    clock.now += 1
    assert sessions.get(session.id) is None
    fresh = sessions.login("t")
    assert fresh is not None
    sessions.logout(fresh.id)
    assert sessions.get(fresh.id) is None
    sessions.logout(fresh.id)  # twice is harmless


def test_the_oldest_session_goes_when_too_many_log_in() -> None:
    sessions = Sessions("t", clock=Clock())
    first = sessions.login("t")
    assert first is not None
    made = [sessions.login("t") for _ in range(MAX_SESSIONS)]
    assert sessions.get(first.id) is None  # evicted
    assert all(s is not None and sessions.get(s.id) is s for s in made)


def test_flashes_are_shown_once() -> None:
    session = Sessions("t", clock=Clock()).login("t")
    assert session is not None
    session.flash("ok", "done")
    assert session.take_flashes() == [("ok", "done")]
    assert session.take_flashes() == []
