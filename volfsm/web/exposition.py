"""Prometheus metrics through `prometheus_client`, the same way for every server.

Each server registers one custom collector (`prometheus_client.registry.Collector`:
a `collect()` yielding metric families) in a private `CollectorRegistry`;
the collector reads the state it reports when it is scraped, as the
kubelet's volume-manager collector does, so nothing is kept twice.
`metrics_response` renders the registry with `generate_latest` (the text
format 0.0.4, with the library's `# HELP`/`# TYPE` lines, number format,
label escaping and ±Inf/NaN) under the content type the library serves it
with.

Counter names keep their `_total`: `CounterMetricFamily("x_total", ...)`
exposes `# TYPE x_total counter` and samples `x_total`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from volfsm.web.http import Response

_ENCODE, CONTENT_TYPE = choose_encoder("")
"""The library's text encoder (`generate_latest`, format 0.0.4) and the content type its own
handler sends with it to a scraper that asks for nothing else."""

Series = Iterable[tuple[Sequence[str], float]]
"""(label values, value) per series of one family."""


def registry_of(*collectors: Collector) -> CollectorRegistry:
    """A private registry holding these collectors (never the process-global one)."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """Collect now and render as Prometheus text."""
    return _ENCODE(registry)


def metrics_response(registry: CollectorRegistry) -> Response:
    """A 200 carrying the registry's metrics collected now."""
    return Response(200, exposition(registry), CONTENT_TYPE)


def gauge(name: str, help_text: str, labels: Sequence[str], series: Series) -> GaugeMetricFamily:
    """A gauge family with these series."""
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in series:
        family.add_metric(values, value)
    return family


def counter(
    name: str, help_text: str, labels: Sequence[str], series: Series
) -> CounterMetricFamily:
    """A counter family with these series; `name` must end in `_total`, or the library
    would add it and the exposed name would not be `name`."""
    if not name.endswith("_total"):
        raise ValueError(f"counter {name} does not end in _total")
    family = CounterMetricFamily(name, help_text, labels=labels)
    for values, value in series:
        family.add_metric(values, value)
    return family
