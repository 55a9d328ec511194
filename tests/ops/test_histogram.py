"""``observe_many`` gives a histogram exactly what observing each value would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from plaita.ops.histogram import observe_many
from plaita.ops.metrics import DURATION_BUCKETS_S


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_a_chunk_lands_in_the_same_buckets_sum_and_count_as_value_by_value() -> None:
    values = [0.0, 1e-6, *DURATION_BUCKETS_S, 0.0042, 0.7, 3.0, 1e9, 0.0042]  # bounds themselves, between, above
    one, many = CollectorRegistry(), CollectorRegistry()
    h_one = Histogram("d", "durations", buckets=DURATION_BUCKETS_S, registry=one)
    h_many = Histogram("d", "durations", buckets=DURATION_BUCKETS_S, registry=many)
    for v in values:
        h_one.observe(v)
    observe_many(h_many, values)
    observe_many(h_many, [])  # nothing, and short chunks take the plain path
    observe_many(h_many, [0.5, 0.5])
    h_one.observe(0.5)
    h_one.observe(0.5)
    assert _samples(many) == _samples(one)


def test_a_chunk_in_one_bucket_counts_as_value_by_value() -> None:
    """The usual chunk (fast handlers: every value in the first bucket) takes one ``inc``."""
    one, many = CollectorRegistry(), CollectorRegistry()
    h_one = Histogram("d", "durations", buckets=DURATION_BUCKETS_S, registry=one)
    h_many = Histogram("d", "durations", buckets=DURATION_BUCKETS_S, registry=many)
    for chunk in ([1e-6] * 40, [DURATION_BUCKETS_S[2]] * 5, [1e9] * 8, [0.0, 1e-9, 0.0, 1e-7]):
        observe_many(h_many, chunk)
        for v in chunk:
            h_one.observe(v)
    got, want = _samples(many), _samples(one)
    # The sum is added per chunk (``sum`` of the chunk), so it may differ in the last bits.
    assert got.pop(("d_sum", ())) == pytest.approx(want.pop(("d_sum", ())), rel=1e-12)
    assert got == want
