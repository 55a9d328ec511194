"""Issue 31, item 4: the dashboard's overview shows how many starts wait for a slot, per flow."""

from __future__ import annotations

import pytest

from tests.dashboard.conftest import MakeDashboard, sample
from tests.ops.test_starts_waiting import park

pytestmark = pytest.mark.redis


def test_the_dashboard_overview_shows_waiting_starts(redis_url: str, make_dashboard: MakeDashboard) -> None:
    park(redis_url, "export", 2)
    dash = make_dashboard()
    assert sample(dash)["starts_waiting"] == {"export": 2}
    live = dash.get("/fragment/overview").text
    card = live.split('id="starts-waiting"', 1)[1].split("</div></div>", 1)[0]
    assert ">2<" in card and '<span data-flow="export">2 export</span>' in card
