"""Tier 1: the lifecycle transition table, checked pair by pair against a hand-written truth table.

No Redis: ``plaita.fsm`` is pure. ``EXPECTED`` below is written by hand, independently of
``plaita/fsm/table.py``; adding a state or a trigger without updating it fails
``test_machine_triples_equal_expected_table`` and adds failing cases to the exhaustive test.
"""

from __future__ import annotations

import itertools
import logging
import re
from datetime import timedelta

import pytest
from freezegun import freeze_time
from transitions import MachineError

import plaita.fsm.states
import plaita.fsm.table
from plaita.fsm import ACTIVE_STATES, TERMINAL_STATES, BackoffPolicy, Lifecycle, State, triggers

S = State


class _NoOp:
    """Marker: the trigger is accepted but the state stays and nothing runs (internal transition)."""

    def __repr__(self) -> str:
        return "NOOP"


NOOP = _NoOp()

#: (state, trigger) -> destination, or NOOP. A pair not listed must raise MachineError.
EXPECTED: dict[tuple[State, str], State | _NoOp] = {
    (S.INIT, "start"): S.ENSURE_GROUP,
    (S.INIT, "stop_requested"): S.STOPPING,
    (S.ENSURE_GROUP, "group_ready"): S.RESUMING_OWN,
    (S.RESUMING_OWN, "own_pending_done"): S.RECLAIMING,
    (S.RESUMING_OWN, "redis_failed"): S.BACKOFF,
    (S.RESUMING_OWN, "stop_requested"): S.STOPPING,
    (S.RESUMING_OWN, "pause_requested"): S.PAUSED,
    (S.ENSURE_GROUP, "redis_failed"): S.BACKOFF,
    (S.ENSURE_GROUP, "stop_requested"): S.STOPPING,
    (S.RECLAIMING, "reclaim_done"): S.READING,
    (S.RECLAIMING, "redis_failed"): S.BACKOFF,
    (S.RECLAIMING, "stop_requested"): S.STOPPING,
    (S.READING, "reclaim_due"): S.RECLAIMING,
    (S.READING, "redis_failed"): S.BACKOFF,
    (S.READING, "stop_requested"): S.STOPPING,
    # A fresh BackoffPolicy has nothing armed, so backoff_due holds; the not-due case is below.
    (S.BACKOFF, "backoff_elapsed"): S.ENSURE_GROUP,
    (S.BACKOFF, "stop_requested"): S.STOPPING,
    (S.ENSURE_GROUP, "pause_requested"): S.PAUSED,
    (S.RECLAIMING, "pause_requested"): S.PAUSED,
    (S.RESUMING_OWN, "suspects_found"): S.ISOLATING,
    (S.RECLAIMING, "suspects_found"): S.ISOLATING,
    (S.ISOLATING, "suspects_cleared"): S.RECLAIMING,
    (S.ISOLATING, "redis_failed"): S.BACKOFF,
    (S.ISOLATING, "stop_requested"): S.STOPPING,
    (S.ISOLATING, "pause_requested"): S.PAUSED,
    (S.READING, "pause_requested"): S.PAUSED,
    (S.BACKOFF, "pause_requested"): S.PAUSED,
    (S.PAUSED, "pause_requested"): NOOP,
    (S.PAUSED, "resume_requested"): S.ENSURE_GROUP,
    (S.PAUSED, "stop_requested"): S.STOPPING,
    (S.STOPPING, "stop_requested"): NOOP,
    (S.STOPPING, "drained"): S.STOPPED,
}

#: The trigger names the issue specifies, in table order.
EXPECTED_TRIGGERS = [
    "start",
    "group_ready",
    "own_pending_done",
    "reclaim_done",
    "reclaim_due",
    "suspects_found",
    "suspects_cleared",
    "redis_failed",
    "backoff_elapsed",
    "pause_requested",
    "resume_requested",
    "stop_requested",
    "drained",
]

ALL_PAIRS = list(itertools.product(State, triggers()))


def _triples(lc: Lifecycle) -> set[tuple[str, str, str | None]]:
    """(source, trigger, dest) for every transition the live machine holds; dest None = internal."""
    return {
        (src, name, t.dest)
        for name, event in lc.machine.events.items()
        for src, transitions in event.transitions.items()
        for t in transitions
    }


class Recorder:
    """A transition listener that remembers every (source, dest, trigger) it is told about."""

    def __init__(self) -> None:
        self.calls: list[tuple[State, State, str]] = []

    def __call__(self, source: State, dest: State, trigger: str) -> None:
        self.calls.append((source, dest, trigger))


class TestExhaustive:
    """Every (State, trigger) pair, each on a fresh machine."""

    @pytest.mark.parametrize(("state", "trigger"), ALL_PAIRS, ids=[f"{s.name}-{t}" for s, t in ALL_PAIRS])
    def test_pair(self, state: State, trigger: str) -> None:
        """The pair goes where EXPECTED says, is a silent no-op, or raises MachineError leaving the state."""
        rec = Recorder()
        lc = Lifecycle(initial=state, listener=rec)
        expected = EXPECTED.get((state, trigger))
        if expected is None:
            with pytest.raises(MachineError, match=re.escape(f"Can't trigger event {trigger} from state")):
                lc.trigger(trigger)
            assert lc.state is state
            assert rec.calls == []
        elif expected is NOOP:
            assert lc.trigger(trigger) is True
            assert lc.state is state
            assert rec.calls == []
        else:
            assert lc.trigger(trigger) is True
            assert lc.state is expected
            assert rec.calls == [(state, expected, trigger)]

    def test_pairs_cover_every_state_and_trigger(self) -> None:
        """The parametrisation spans all states and exactly the issue's triggers."""
        assert triggers() == EXPECTED_TRIGGERS
        assert len(ALL_PAIRS) == len(State) * len(EXPECTED_TRIGGERS)
        assert {s for s, _ in EXPECTED} | {S.STOPPED} == set(State)

    def test_machine_triples_equal_expected_table(self) -> None:
        """The machine's (source, trigger, dest) triples are exactly those of the hand-written table."""
        expected = {(s.name, t, dest.name if isinstance(dest, State) else None) for (s, t), dest in EXPECTED.items()}
        assert _triples(Lifecycle()) == expected

    def test_machine_events_are_the_table_triggers(self) -> None:
        """No auto ``to_<STATE>`` triggers exist; the machine's events are the table's triggers."""
        assert list(Lifecycle().machine.events) == EXPECTED_TRIGGERS


class TestBackoffCondition:
    """``backoff_elapsed`` is guarded by ``backoff_due``."""

    def test_not_due_stays_in_backoff(self) -> None:
        """Before the delay passes, backoff_elapsed returns False and stays in BACKOFF without notifying."""
        with freeze_time("2024-01-01") as frozen:
            rec = Recorder()
            lc = Lifecycle(initial=S.READING, listener=rec, backoff=BackoffPolicy(jitter=0.0))
            assert lc.trigger("redis_failed") is True
            rec.calls.clear()
            entered = lc.entered_at_s
            frozen.tick(timedelta(seconds=0.05))  # base delay is 0.1 s
            assert lc.may_trigger("backoff_elapsed") is False
            assert lc.trigger("backoff_elapsed") is False
            assert lc.state is S.BACKOFF
            assert rec.calls == []
            assert lc.entered_at_s == entered

    def test_due_goes_to_ensure_group(self) -> None:
        """Once the delay passes, backoff_elapsed goes to ENSURE_GROUP."""
        with freeze_time("2024-01-01") as frozen:
            rec = Recorder()
            lc = Lifecycle(initial=S.READING, listener=rec, backoff=BackoffPolicy(jitter=0.0))
            lc.trigger("redis_failed")
            frozen.tick(timedelta(seconds=0.1))
            assert lc.may_trigger("backoff_elapsed") is True
            assert lc.trigger("backoff_elapsed") is True
            assert lc.state is S.ENSURE_GROUP
            assert rec.calls[-1] == (S.BACKOFF, S.ENSURE_GROUP, "backoff_elapsed")

    def test_redis_failed_arms_backoff(self) -> None:
        """Entering BACKOFF via redis_failed arms the policy; persistent=True is recorded and skips the ramp."""
        with freeze_time("2024-01-01"):
            lc = Lifecycle(initial=S.RECLAIMING, backoff=BackoffPolicy(jitter=0.0, persistent_s=7.0))
            lc.trigger("redis_failed", persistent=True)
            assert lc.last_failure_persistent is True
            assert lc.backoff.attempt == 1
            assert lc.backoff.remaining_s() == pytest.approx(7.0)


class TestTableRules:
    """The structural rules of the issue, read from the live machine rather than from EXPECTED."""

    def test_every_active_failure_goes_to_backoff(self) -> None:
        """redis_failed is accepted exactly in ENSURE_GROUP, RESUMING_OWN, RECLAIMING, ISOLATING and READING
        -> BACKOFF."""
        machine = Lifecycle().machine
        assert set(ACTIVE_STATES) == {S.ENSURE_GROUP, S.RESUMING_OWN, S.RECLAIMING, S.ISOLATING, S.READING}
        found = {(t.source, t.dest) for t in machine.get_transitions(trigger="redis_failed")}
        assert found == {(s.name, "BACKOFF") for s in ACTIVE_STATES}

    def test_backoff_reaches_ensure_group_only_via_backoff_elapsed(self) -> None:
        """From BACKOFF the only ways out are backoff_elapsed (guarded) to ENSURE_GROUP and stop_requested."""
        machine = Lifecycle().machine
        out = {(name, t.dest) for name in triggers() for t in machine.get_transitions(trigger=name, source=S.BACKOFF)}
        assert out == {
            ("backoff_elapsed", "ENSURE_GROUP"),
            ("stop_requested", "STOPPING"),
            ("pause_requested", "PAUSED"),
        }
        (guarded,) = machine.get_transitions(trigger="backoff_elapsed", source=S.BACKOFF)
        assert [c.func for c in guarded.conditions] == ["backoff_due"]

    def test_every_non_terminal_state_accepts_stop(self) -> None:
        """stop_requested leads to STOPPING from every state that is neither terminal nor STOPPING."""
        for state in State:
            if state in TERMINAL_STATES or state is S.STOPPING:
                continue
            lc = Lifecycle(initial=state)
            assert lc.trigger("stop_requested") is True, state
            assert lc.state is S.STOPPING, state

    def test_stop_in_stopping_is_a_silent_no_op(self) -> None:
        """A second stop_requested runs no enter/exit callback, fires no listener and keeps entered_at_s."""
        with freeze_time("2024-01-01") as frozen:
            rec = Recorder()
            lc = Lifecycle(initial=S.READING, listener=rec)
            stopping = lc.machine.get_state(S.STOPPING)
            ran: list[str] = []
            stopping.add_callback("enter", lambda event: ran.append("enter"))
            stopping.add_callback("exit", lambda event: ran.append("exit"))
            lc.trigger("stop_requested")
            assert ran == ["enter"]  # the instrumentation works on a real transition
            entered = lc.entered_at_s
            frozen.tick(timedelta(seconds=3))
            assert lc.trigger("stop_requested") is True
            assert lc.state is S.STOPPING
            assert ran == ["enter"]
            assert rec.calls == [(S.READING, S.STOPPING, "stop_requested")]
            assert lc.entered_at_s == entered
            lc.trigger("drained")
            assert ran == ["enter", "exit"]

    def test_stopping_leads_only_to_stopped(self) -> None:
        """Every real transition out of STOPPING ends in STOPPED."""
        machine = Lifecycle().machine
        leaving = [
            (name, t.dest) for name in triggers() for t in machine.get_transitions(trigger=name, source="STOPPING")
        ]
        assert {dest for _, dest in leaving if dest is not None} == {"STOPPED"}
        assert sorted(machine.get_triggers("STOPPING")) == ["drained", "stop_requested"]

    def test_stopped_is_terminal(self) -> None:
        """STOPPED accepts no trigger at all and is the only terminal state."""
        machine = Lifecycle().machine
        assert machine.get_triggers("STOPPED") == []
        assert machine.get_transitions(source="STOPPED") == []
        assert {S.STOPPED} == TERMINAL_STATES

    def test_public_imports(self) -> None:
        """``from plaita.fsm import State, TRANSITIONS`` gives the table module's objects."""
        from plaita.fsm import TRANSITIONS, State

        assert TRANSITIONS is plaita.fsm.table.TRANSITIONS
        assert State is plaita.fsm.states.State
        assert all({"trigger", "source", "dest"} <= set(t) for t in TRANSITIONS)


class TestModelBinding:
    """transitions binds exactly ``trigger`` and ``may_trigger`` onto the model; nothing is shadowed."""

    def test_trigger_names_do_not_collide_with_model_attributes(self) -> None:
        """No name transitions could bind (trigger, may_, is_, to_) is a Lifecycle attribute except the stubs."""
        lc = Lifecycle()
        bindable = {"trigger", "may_trigger"}
        bindable |= {n for t in triggers() for n in (t, f"may_{t}")}
        bindable |= {n for s in State for n in (f"is_{s.name}", f"to_{s.name}")}
        clashes = {n for n in bindable if hasattr(Lifecycle, n) or n in vars(lc)}
        assert clashes == {"trigger", "may_trigger"}

    def test_stubs_are_replaced_by_transitions(self) -> None:
        """``trigger``/``may_trigger`` on an instance are transitions' bound callables, not the stubs."""
        lc = Lifecycle()
        assert "trigger" in vars(lc)
        assert "may_trigger" in vars(lc)
        assert lc.may_trigger("start") is True
        assert lc.may_trigger("group_ready") is False
        assert lc.trigger("start") is True
        assert lc.state is S.ENSURE_GROUP

    def test_unknown_trigger_raises_attribute_error(self) -> None:
        """A name outside the table is an AttributeError, not a silent no-op."""
        lc = Lifecycle()
        with pytest.raises(AttributeError):
            lc.trigger("no_such_trigger")
        assert lc.state is S.INIT

    def test_only_policy_skips_are_logged(self, caplog: pytest.LogCaptureFixture) -> None:
        """Every "Skip binding" warning is one model_override predicts; trigger/may_trigger are never skipped."""
        caplog.set_level(logging.WARNING, logger="transitions")
        Lifecycle()
        skipped = {
            m.group(1)
            for r in caplog.records
            if (m := re.match(r"Skip binding of '(\w+)'", r.getMessage())) is not None
        }
        predicted = {n for t in triggers() for n in (t, f"may_{t}")} | {f"is_{s.name}" for s in State}
        assert skipped == predicted
        assert not ({"trigger", "may_trigger"} & skipped)


class TestListener:
    """The listener and ``entered_at_s`` follow every real transition."""

    def test_happy_path_notifies_each_transition(self) -> None:
        """A full run (with one outage) reports each (source, dest, trigger) in order and moves entered_at_s."""
        steps: list[tuple[str, State]] = [
            ("start", S.ENSURE_GROUP),
            ("group_ready", S.RESUMING_OWN),
            ("own_pending_done", S.RECLAIMING),
            ("reclaim_done", S.READING),
            ("reclaim_due", S.RECLAIMING),
            ("reclaim_done", S.READING),
            ("redis_failed", S.BACKOFF),
            ("backoff_elapsed", S.ENSURE_GROUP),
            ("group_ready", S.RESUMING_OWN),
            ("redis_failed", S.BACKOFF),
            ("backoff_elapsed", S.ENSURE_GROUP),
            ("group_ready", S.RESUMING_OWN),
            ("own_pending_done", S.RECLAIMING),
            ("reclaim_done", S.READING),
            ("stop_requested", S.STOPPING),
            ("drained", S.STOPPED),
        ]
        with freeze_time("2024-01-01") as frozen:
            rec = Recorder()
            lc = Lifecycle(listener=rec, backoff=BackoffPolicy(jitter=0.0, cap_s=1.0))
            expected_calls = []
            source = lc.state
            assert lc.seconds_in_state() == 0.0
            for trigger, dest in steps:
                frozen.tick(timedelta(seconds=2))  # longer than any backoff here
                assert lc.seconds_in_state() == pytest.approx(2.0)
                before = lc.entered_at_s
                assert lc.trigger(trigger) is True
                assert lc.state is dest
                assert lc.entered_at_s == pytest.approx(before + 2.0)
                assert lc.seconds_in_state() == 0.0
                expected_calls.append((source, dest, trigger))
                source = dest
            assert rec.calls == expected_calls

    def test_failed_trigger_does_not_notify(self) -> None:
        """A MachineError neither calls the listener nor moves entered_at_s."""
        with freeze_time("2024-01-01") as frozen:
            rec = Recorder()
            lc = Lifecycle(listener=rec)
            entered = lc.entered_at_s
            frozen.tick(timedelta(seconds=1))
            with pytest.raises(MachineError):
                lc.trigger("drained")
            assert rec.calls == []
            assert lc.entered_at_s == entered
            assert lc.seconds_in_state() == pytest.approx(1.0)
