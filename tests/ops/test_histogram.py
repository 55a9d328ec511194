"""``observe_many`` gives a histogram exactly what observing each value would."""

from __future__ import annotations

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
