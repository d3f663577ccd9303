"""A6: Erlang/OTP-style supervision of pykka actors (fermix.supervisor, fermix.actors.base).

Nothing here sleeps to wait for a thread: tests wait on a condition over what the actors
did (the journal) or what the supervisor logged, each bounded by five seconds, and use
``which_children()`` as a barrier, since the supervisor answers it after every exit
reported before the call.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pykka
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fermix.actors.base import SupervisedActor
from fermix.errors import (
    ActorUnavailableError,
    InvalidInputError,
    NotFoundError,
    SupervisorEscalationError,
)
from fermix.supervisor import (
    ChildCounts,
    ChildInfo,
    ChildSpec,
    Intensity,
    Restart,
    Strategy,
    Supervisor,
    record_restart,
    should_restart,
)

WAIT_S = 5.0


class Journal:
    """What factories and actors did, in order, across threads."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, str]] = []
        self._changed = threading.Condition()

    def add(self, what: str, who: str) -> None:
        with self._changed:
            self.entries.append((what, who))
            self._changed.notify_all()

    def wait_for(self, what: str, who: str, count: int = 1) -> None:
        with self._changed:
            assert self._changed.wait_for(
                lambda: self.entries.count((what, who)) >= count, WAIT_S
            ), f"no {count} x {(what, who)} in {self.entries}"


class LogWatch(logging.Handler):
    """The supervisor's log messages, waitable."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            self.messages.append(record.getMessage())
            self._changed.notify_all()

    def matching(self, *fragments: str) -> list[str]:
        with self._changed:  # a Condition's lock is reentrant: wait_for's predicate calls this
            return [m for m in self.messages if all(f in m for f in fragments)]

    def wait_for(self, *fragments: str, count: int = 1) -> None:
        with self._changed:
            found = self._changed.wait_for(lambda: len(self.matching(*fragments)) >= count, WAIT_S)
            assert found, f"no {count} x {fragments} in {self.messages}"


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Crash:
    """Told to a Worker: raise from the message."""


class Exit:
    """Told to a Worker: raise SystemExit, a BaseException, from the message."""


class Ping:
    """Asked of a Worker: answer "pong"."""


class BadQuestion:
    """Asked of a Worker: raise back to the asker."""


class Worker(SupervisedActor):
    """Journals its stop and failure; its hooks deliberately do not call super()."""

    def __init__(self, journal: Journal, name: str, **faults: bool) -> None:
        super().__init__()
        self.journal = journal
        self.name = name
        self.faults = faults

    def on_start(self) -> None:
        if self.faults.get("on_start"):
            raise RuntimeError(f"{self.name} cannot start")
        if self.faults.get("exit_on_start"):
            raise SystemExit(f"{self.name} exits")

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Crash):
            raise RuntimeError(f"{self.name} crashed")
        if isinstance(message, Exit):
            raise SystemExit(f"{self.name} exits")
        if isinstance(message, BadQuestion):
            raise ValueError("bad question")
        return "pong" if isinstance(message, Ping) else None

    def on_stop(self) -> None:
        self.journal.add("stop", self.name)
        if self.faults.get("on_stop"):
            raise RuntimeError(f"{self.name} cannot stop")

    def on_failure(self, *exc_info: object) -> None:
        self.journal.add("failure", self.name)
        if self.faults.get("on_failure"):
            raise RuntimeError(f"{self.name} cannot clean up")


class Blocker(SupervisedActor):
    """An actor whose on_stop waits for the test to release it."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def on_stop(self) -> None:
        self.release.wait(WAIT_S)


class Unsupervised(pykka.ThreadingActor):
    """A plain pykka actor: it cannot report its exit."""


def worker(
    journal: Journal, name: str, first_only: bool = False, **faults: bool
) -> Callable[[], pykka.ActorRef[Worker]]:
    """A start factory that journals each start; ``first_only`` applies faults once."""
    attempts = itertools.count()

    def start() -> pykka.ActorRef[Worker]:
        journal.add("start", name)
        first = next(attempts) == 0
        return Worker.start(journal, name, **(faults if first or not first_only else {}))

    return start


def spec(journal: Journal, name: str, restart: Restart = Restart.PERMANENT) -> ChildSpec:
    return ChildSpec(name, worker(journal, name), restart)


def starts(*names: str) -> list[tuple[str, str]]:
    return [("start", n) for n in names]


def stops(*names: str) -> list[tuple[str, str]]:
    return [("stop", n) for n in names]


MakeSupervisor = Callable[..., Supervisor]


@pytest.fixture(autouse=True)
def _stop_all() -> Iterator[list[Supervisor]]:
    """Stop the supervisors a test started, then every actor (before supervisors, actors
    stopped by ActorRegistry.stop_all() would be restarted)."""
    started: list[Supervisor] = []
    yield started
    for sup in reversed(started):
        sup.stop(timeout=WAIT_S * 2)
    pykka.ActorRegistry.stop_all()


@pytest.fixture
def supervise(_stop_all: list[Supervisor]) -> MakeSupervisor:
    """Start a supervisor over the given specs; it is stopped after the test."""

    def make(*specs: ChildSpec, **options: Any) -> Supervisor:
        sup = Supervisor(specs, **options).start()
        _stop_all.append(sup)
        return sup

    return make


@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
def logs() -> Iterator[LogWatch]:
    watch = LogWatch()
    logger = logging.getLogger("fermix.supervisor")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(watch)
    yield watch
    logger.removeHandler(watch)
    logger.setLevel(level)


def crash(sup: Supervisor, child_id: str) -> None:
    ref = sup.child_ref(child_id)
    assert isinstance(ref, pykka.ActorRef)
    ref.tell(Crash())


def stop(sup: Supervisor, child_id: str) -> None:
    ref = sup.child_ref(child_id)
    assert isinstance(ref, pykka.ActorRef)
    ref.stop()


# Order


def test_a6_children_start_in_order_and_stop_in_reverse_order_nested_included(
    supervise: MakeSupervisor, journal: Journal
) -> None:
    def inner() -> Supervisor:
        return Supervisor([spec(journal, "c"), spec(journal, "d")], name="inner").start()

    sup = supervise(
        spec(journal, "a"), spec(journal, "b"), ChildSpec("inner", inner), spec(journal, "e")
    )
    sup.stop(timeout=WAIT_S)
    assert journal.entries == starts("a", "b", "c", "d", "e") + stops("e", "d", "c", "b", "a")
    assert not sup.is_alive()
    sup.wait(0)


# Strategies


def test_a6_one_for_one_restarts_only_the_crashed_child(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(*(spec(journal, n) for n in "abc"))
    crash(sup, "b")
    logs.wait_for("child 'b' exited with RuntimeError('b crashed'); restarted 'b' (one_for_one)")
    assert journal.entries == [*starts("a", "b", "c"), ("failure", "b"), *starts("b")]


def test_a6_one_for_all_restarts_every_sibling(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(*(spec(journal, n) for n in "abc"), strategy=Strategy.ONE_FOR_ALL)
    crash(sup, "b")
    logs.wait_for("child 'b' exited", "restarted 'a', 'b', 'c' (one_for_all)")
    assert journal.entries == [
        *starts("a", "b", "c"),
        ("failure", "b"),
        *stops("c", "a"),
        *starts("a", "b", "c"),
    ]


def test_a6_rest_for_one_restarts_the_crashed_child_and_those_started_after_it(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(*(spec(journal, n) for n in "abc"), strategy=Strategy.REST_FOR_ONE)
    crash(sup, "b")
    logs.wait_for("child 'b' exited", "restarted 'b', 'c' (rest_for_one)")
    assert journal.entries == [
        *starts("a", "b", "c"),
        ("failure", "b"),
        *stops("c"),
        *starts("b", "c"),
    ]


def test_a6_one_for_all_drops_a_temporary_sibling_and_leaves_a_transient_one_down(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(
        spec(journal, "tmp", Restart.TEMPORARY),
        spec(journal, "tr", Restart.TRANSIENT),
        spec(journal, "p"),
        strategy=Strategy.ONE_FOR_ALL,
    )
    stop(sup, "tr")
    logs.wait_for("child 'tr' exited normally; transient, not restarted")
    crash(sup, "p")
    logs.wait_for("child 'p' exited", "restarted 'p' (one_for_all)")
    assert [(c.id, c.ref is not None) for c in sup.which_children()] == [
        ("tr", False),
        ("p", True),
    ]
    assert journal.entries[-3:] == [("failure", "p"), ("stop", "tmp"), ("start", "p")]


# Restart types


@pytest.mark.parametrize("end", [crash, stop], ids=["crash", "normal_stop"])
def test_a6_permanent_child_is_restarted_after_any_exit(
    supervise: MakeSupervisor,
    journal: Journal,
    logs: LogWatch,
    end: Callable[[Supervisor, str], None],
) -> None:
    sup = supervise(spec(journal, "a", Restart.PERMANENT))
    end(sup, "a")
    logs.wait_for("child 'a' exited", "restarted 'a'")
    assert journal.entries.count(("start", "a")) == 2


def test_a6_transient_child_is_restarted_after_a_crash(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(spec(journal, "a", Restart.TRANSIENT))
    crash(sup, "a")
    logs.wait_for("child 'a' exited with RuntimeError('a crashed'); restarted 'a'")
    assert sup.which_children()[0].ref is sup.child_ref("a")


def test_a6_transient_child_is_not_restarted_after_a_normal_stop(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(spec(journal, "a", Restart.TRANSIENT))
    stop(sup, "a")
    logs.wait_for("child 'a' exited normally; transient, not restarted")
    assert sup.which_children() == [ChildInfo("a", None, Restart.TRANSIENT)]
    assert journal.entries == [*starts("a"), *stops("a")]


@pytest.mark.parametrize("end", [crash, stop], ids=["crash", "normal_stop"])
def test_a6_temporary_child_is_never_restarted_and_is_forgotten(
    supervise: MakeSupervisor,
    journal: Journal,
    logs: LogWatch,
    end: Callable[[Supervisor, str], None],
) -> None:
    sup = supervise(spec(journal, "a", Restart.TEMPORARY), spec(journal, "b"))
    end(sup, "a")
    logs.wait_for("child 'a' exited", "temporary, not restarted")
    assert [c.id for c in sup.which_children()] == ["b"]
    assert journal.entries.count(("start", "a")) == 1


# Every way an actor ends reaches its supervisor


def test_a6_a_failing_on_start_is_an_abnormal_exit(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    factory = worker(journal, "a", first_only=True, on_start=True)
    sup = supervise(ChildSpec("a", factory, Restart.TRANSIENT))
    logs.wait_for("child 'a' exited with RuntimeError('a cannot start'); restarted 'a'")
    ref = sup.child_ref("a")
    assert isinstance(ref, pykka.ActorRef)
    assert ref.ask(Ping()) == "pong"
    assert ("failure", "a") not in journal.entries  # pykka calls neither on_failure ...
    assert ("stop", "a") not in journal.entries  # ... nor on_stop after on_start raised


def test_a6_a_failing_on_stop_is_an_abnormal_exit(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    factory = worker(journal, "a", first_only=True, on_stop=True)
    sup = supervise(ChildSpec("a", factory, Restart.TRANSIENT))
    stop(sup, "a")
    logs.wait_for("child 'a' exited with RuntimeError('a cannot stop'); restarted 'a'")


def test_a6_a_failing_on_failure_still_reports_the_original_crash(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    factory = worker(journal, "a", first_only=True, on_failure=True)
    sup = supervise(ChildSpec("a", factory, Restart.TRANSIENT))
    crash(sup, "a")
    logs.wait_for("child 'a' exited with RuntimeError('a crashed'); restarted 'a'")


def test_a6_a_failing_ask_is_returned_to_the_caller_and_is_not_a_crash(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(spec(journal, "a"))
    ref = sup.child_ref("a")
    assert isinstance(ref, pykka.ActorRef)
    with pytest.raises(ValueError, match="bad question"):
        ref.ask(BadQuestion())
    assert ref.ask(Ping()) == "pong"
    assert sup.which_children() == [ChildInfo("a", ref, Restart.PERMANENT)]
    assert logs.matching("exited") == []


def test_a6_a_base_exception_in_a_message_is_a_normal_exit_and_pykka_stops_every_actor(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(ChildSpec("a", worker(journal, "a"), Restart.TRANSIENT))
    lone = Worker.start(journal, "lone")  # not supervised: pykka's stop_all() stops it too
    ref = sup.child_ref("a")
    assert isinstance(ref, pykka.ActorRef)
    ref.tell(Exit())
    logs.wait_for("child 'a' exited normally; transient, not restarted")
    journal.wait_for("stop", "lone")
    assert not lone.is_alive()
    assert ("stop", "a") in journal.entries  # pykka calls on_stop ...
    assert ("failure", "a") not in journal.entries  # ... and not on_failure


def test_a6_a_base_exception_in_on_start_is_an_abnormal_exit_and_ends_the_thread(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    escaped: list[BaseException | None] = []
    thread_ended = threading.Event()

    def excepthook(args: threading.ExceptHookArgs) -> None:
        escaped.append(args.exc_value)
        thread_ended.set()

    monkeypatch.setattr(threading, "excepthook", excepthook)
    factory = worker(journal, "a", first_only=True, exit_on_start=True)
    sup = supervise(ChildSpec("a", factory, Restart.TRANSIENT))
    logs.wait_for("child 'a' exited with SystemExit('a exits'); restarted 'a'")
    assert thread_ended.wait(WAIT_S)  # pykka lets it escape the thread; it is reported first
    assert [type(exc) for exc in escaped] == [SystemExit]
    ref = sup.child_ref("a")
    assert isinstance(ref, pykka.ActorRef)
    assert ref.ask(Ping()) == "pong"
    assert ("failure", "a") not in journal.entries
    assert ("stop", "a") not in journal.entries


def test_a6_a_supervised_actor_started_outside_a_supervisor_is_a_plain_actor(
    journal: Journal,
) -> None:
    ref = Worker.start(journal, "lone")
    assert ref.ask(Ping()) == "pong"
    assert ref.stop() is True
    assert journal.entries == stops("lone")


# Restart intensity and escalation


def test_a6_intensity_exceeded_stops_children_in_reverse_order_and_escalates(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    escalated: list[SupervisorEscalationError] = []
    sup = supervise(
        *(spec(journal, n) for n in "abc"),
        intensity=Intensity(max_restarts=2, period_s=10),
        monotonic=FakeClock(),
        on_escalate=escalated.append,
        name="top",
    )
    for n in (1, 2):
        crash(sup, "b")
        logs.wait_for("child 'b' exited", "restarted 'b'", count=n)
    crash(sup, "b")
    with pytest.raises(SupervisorEscalationError, match="more than 2 restarts in 10s") as error:
        sup.wait(WAIT_S)
    assert escalated == [error.value]
    assert isinstance(error.value.__cause__, RuntimeError)
    assert sup.failure is error.value
    assert journal.entries[-3:] == [("failure", "b"), *stops("c", "a")]
    assert logs.matching("supervisor 'top' gave up", "child 'b' exited with RuntimeError")
    with pytest.raises(ActorUnavailableError):
        sup.which_children()


def test_a6_restarts_older_than_the_period_do_not_count(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    clock = FakeClock()
    sup = supervise(spec(journal, "a"), intensity=Intensity(1, 10), monotonic=clock)
    crash(sup, "a")
    logs.wait_for("restarted 'a'", count=1)
    clock.now = 10.5
    crash(sup, "a")
    logs.wait_for("restarted 'a'", count=2)
    clock.now = 11.0
    crash(sup, "a")
    with pytest.raises(SupervisorEscalationError):
        sup.wait(WAIT_S)


def test_a6_a_restart_whose_factory_keeps_failing_ends_in_escalation(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    attempts = itertools.count()

    def factory() -> pykka.ActorRef[Worker]:
        if next(attempts) > 0:
            raise OSError("no database")
        return Worker.start(journal, "a")

    sup = supervise(ChildSpec("a", factory), intensity=Intensity(2, 10), monotonic=FakeClock())
    crash(sup, "a")
    with pytest.raises(SupervisorEscalationError) as error:
        sup.wait(WAIT_S)
    assert isinstance(error.value.__cause__, ActorUnavailableError)
    assert isinstance(error.value.__cause__.__cause__, OSError)
    assert len(logs.matching("restart failed")) == 2


def test_a6_a_nested_supervisor_that_gives_up_is_restarted_by_its_parent(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    inners: list[Supervisor] = []

    def inner() -> Supervisor:
        sup = Supervisor([spec(journal, "w")], intensity=Intensity(0, 10), name="inner")
        inners.append(sup)
        return sup.start()

    escalated: list[SupervisorEscalationError] = []
    top = supervise(
        ChildSpec("inner", inner), spec(journal, "x"), on_escalate=escalated.append, name="top"
    )
    crash(inners[0], "w")
    logs.wait_for(
        "supervisor 'top': child 'inner' exited with SupervisorEscalationError", "restarted"
    )
    with pytest.raises(SupervisorEscalationError, match="supervisor 'inner' gave up"):
        inners[0].wait(0)
    assert top.child_ref("inner") is inners[1]
    w = inners[1].child_ref("w")
    assert isinstance(w, pykka.ActorRef)
    assert w.ask(Ping()) == "pong"
    assert escalated == []
    assert journal.entries == [*starts("w", "x"), ("failure", "w"), *starts("w")]
    assert top.count_children() == ChildCounts(specs=2, active=2, supervisors=1, workers=1)


def test_a6_escalation_climbs_to_the_top_which_calls_on_escalate(
    supervise: MakeSupervisor, journal: Journal
) -> None:
    def inner() -> Supervisor:
        return Supervisor([spec(journal, "w")], intensity=Intensity(0, 10), name="inner").start()

    escalated = threading.Event()
    errors: list[SupervisorEscalationError] = []

    def on_escalate(error: SupervisorEscalationError) -> None:
        errors.append(error)
        escalated.set()

    top = supervise(
        spec(journal, "x"),
        ChildSpec("inner", inner),
        intensity=Intensity(0, 10),
        on_escalate=on_escalate,
        name="top",
    )
    inner_sup = top.child_ref("inner")
    assert isinstance(inner_sup, Supervisor)
    crash(inner_sup, "w")
    assert escalated.wait(WAIT_S)
    assert "supervisor 'top' gave up" in str(errors[0])
    assert isinstance(errors[0].__cause__, SupervisorEscalationError)
    assert journal.entries == [*starts("x", "w"), ("failure", "w"), *stops("x")]


# Stopping


def test_a6_a_child_that_does_not_stop_in_time_is_logged_and_abandoned(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    release = threading.Event()
    sup = supervise(
        spec(journal, "a"),
        ChildSpec("stuck", lambda: Blocker.start(release), shutdown_timeout=0.1),
    )
    try:
        sup.stop(timeout=WAIT_S)
    finally:
        release.set()
    assert logs.matching("child 'stuck' did not stop within 0.1s; abandoned")
    assert journal.entries == [*starts("a"), *stops("a")]


def test_a6_a_stopped_supervisor_refuses_calls(supervise: MakeSupervisor, journal: Journal) -> None:
    sup = supervise(spec(journal, "a"))
    sup.stop()
    sup.stop()
    with pytest.raises(ActorUnavailableError):
        sup.start_child(spec(journal, "b"))
    with pytest.raises(ActorUnavailableError):
        sup.child_ref("a")


# Starting


def test_a6_a_child_that_cannot_start_fails_the_start_and_stops_those_started(
    journal: Journal,
) -> None:
    def broken() -> pykka.ActorRef[Worker]:
        raise OSError("no database")

    sup = Supervisor([spec(journal, "a"), ChildSpec("b", broken), spec(journal, "c")])
    with pytest.raises(ActorUnavailableError, match="child 'b'") as error:
        sup.start()
    assert isinstance(error.value.__cause__, OSError)
    assert journal.entries == [*starts("a"), *stops("a")]
    sup.wait(WAIT_S)


def test_a6_a_factory_must_return_an_actor_that_reports_its_exit(
    supervise: MakeSupervisor,
) -> None:
    refs: list[pykka.ActorRef[Unsupervised]] = []

    def plain() -> pykka.ActorRef[Unsupervised]:
        refs.append(Unsupervised.start())
        return refs[-1]

    sup = supervise()
    with pytest.raises(ActorUnavailableError, match="SupervisedActor"):
        sup.start_child(ChildSpec("plain", plain))
    assert not refs[0].is_alive()
    assert sup.which_children() == []


def test_a6_duplicate_child_ids_are_refused(supervise: MakeSupervisor, journal: Journal) -> None:
    with pytest.raises(InvalidInputError):
        Supervisor([spec(journal, "a"), spec(journal, "a")])
    sup = supervise(spec(journal, "a"))
    with pytest.raises(InvalidInputError):
        sup.start_child(spec(journal, "a"))


# Dynamic children


def test_a6_start_child_and_terminate_child_at_runtime_without_a_restart(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise()
    one = sup.start_child(spec(journal, "conv-1"))
    two = sup.start_child(spec(journal, "conv-2", Restart.TRANSIENT))
    assert sup.which_children() == [
        ChildInfo("conv-1", one, Restart.PERMANENT),
        ChildInfo("conv-2", two, Restart.TRANSIENT),
    ]
    sup.terminate_child("conv-1")
    logs.wait_for("ignored the exit of a stopped child")
    assert sup.which_children() == [ChildInfo("conv-2", two, Restart.TRANSIENT)]
    assert journal.entries == [*starts("conv-1", "conv-2"), *stops("conv-1")]
    with pytest.raises(NotFoundError):
        sup.terminate_child("conv-1")
    assert sup.count_children() == ChildCounts(specs=1, active=1, supervisors=0, workers=1)


def test_a6_start_child_raises_when_the_child_cannot_start(supervise: MakeSupervisor) -> None:
    def broken() -> pykka.ActorRef[Worker]:
        raise OSError("no database")

    sup = supervise()
    with pytest.raises(ActorUnavailableError, match="no database"):
        sup.start_child(ChildSpec("conv", broken))
    assert sup.count_children() == ChildCounts(0, 0, 0, 0)


# Looking children up


def test_a6_child_ref_returns_the_new_ref_after_a_restart(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(spec(journal, "a"))
    old = sup.child_ref("a")
    assert isinstance(old, pykka.ActorRef)
    old.tell(Crash())
    logs.wait_for("restarted 'a'")
    new = sup.child_ref("a")
    assert isinstance(new, pykka.ActorRef)
    assert new.actor_urn != old.actor_urn
    assert not old.is_alive()
    assert new.ask(Ping()) == "pong"


def test_a6_child_ref_raises_for_an_unknown_or_stopped_child(
    supervise: MakeSupervisor, journal: Journal, logs: LogWatch
) -> None:
    sup = supervise(spec(journal, "a", Restart.TRANSIENT))
    with pytest.raises(NotFoundError):
        sup.child_ref("nobody")
    stop(sup, "a")
    logs.wait_for("not restarted")
    with pytest.raises(ActorUnavailableError, match="not running"):
        sup.child_ref("a")


# Rules as pure functions


@pytest.mark.parametrize(
    ("restart", "crashed", "expected"),
    [
        (Restart.PERMANENT, False, True),
        (Restart.PERMANENT, True, True),
        (Restart.TRANSIENT, False, False),
        (Restart.TRANSIENT, True, True),
        (Restart.TEMPORARY, False, False),
        (Restart.TEMPORARY, True, False),
    ],
)
def test_a6_should_restart_follows_the_otp_restart_types(
    restart: Restart, crashed: bool, expected: bool
) -> None:
    assert should_restart(restart, RuntimeError() if crashed else None) is expected


@given(
    gaps=st.lists(st.floats(min_value=0, max_value=10, allow_nan=False), max_size=30),
    max_restarts=st.integers(min_value=0, max_value=5),
    period_s=st.floats(min_value=0.5, max_value=20),
)
def test_a6_record_restart_allows_at_most_max_restarts_within_the_period(
    gaps: list[float], max_restarts: int, period_s: float
) -> None:
    intensity = Intensity(max_restarts, period_s)
    history: deque[float] = deque()
    times = list(itertools.accumulate(gaps))
    for i, now in enumerate(times):
        in_window = [t for t in times[: i + 1] if now - t <= period_s]
        assert record_restart(history, now, intensity) is (len(in_window) <= max_restarts)


def test_a6_intensity_refuses_a_negative_limit_or_an_empty_period() -> None:
    with pytest.raises(InvalidInputError):
        Intensity(max_restarts=-1)
    with pytest.raises(InvalidInputError):
        Intensity(period_s=0)
