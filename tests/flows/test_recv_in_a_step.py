"""ctx.recv in a step, without a server: with no message at hand it raises the suspension waiting for
its topic; with one it returns it once per run, and None once the wait timed out."""

from __future__ import annotations

import pickle

import pytest

from plaita.flows.model.context import Receiving, Resume, StepContext
from plaita.testing import step_context


def _ctx(resume: Resume | None) -> StepContext:
    return step_context(execution_id="e", flow_id="f", step="s", resume=resume)  # the kit's, as users build it


def test_recv_without_a_message_raises_the_suspension_for_its_topic() -> None:
    with pytest.raises(Receiving) as caught:
        _ctx(None).recv("t", timeout_s=5)
    suspension = caught.value.suspension
    assert (suspension.wait_for, suspension.timeout_s) == ("t", 5)
    again = pickle.loads(pickle.dumps(caught.value))  # back from a --pool process child
    assert (again.topic, again.timeout_s) == ("t", 5)
    with pytest.raises(Receiving):  # a plain wait's resume is no message
        _ctx(Resume("event", "x")).recv("t")


def test_recv_returns_the_message_once_per_run_and_none_on_timeout() -> None:
    ctx = _ctx(Resume("event", {"n": 1}, wait_for="t"))
    assert ctx.recv("t") == {"n": 1}
    with pytest.raises(ValueError, match="one recv per run"):
        ctx.recv("t")
    with pytest.raises(ValueError, match="one recv per run"):
        _ctx(Resume("event", 1, wait_for="a")).recv("b")
    assert _ctx(Resume("timeout", None, wait_for="t")).recv("t") is None
    with pytest.raises(Receiving):  # an operator's retry of the wait: it waits again
        _ctx(Resume("retry", None, wait_for="t")).recv("t")
    with pytest.raises(ValueError, match="topic"):
        _ctx(None).recv("")
    with pytest.raises(ValueError):
        _ctx(None).recv("t", timeout_s=-1)
