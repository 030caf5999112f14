"""Reading a `/metrics` page as a scraper does: with `prometheus_client`'s parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Series = tuple[str, tuple[str, ...]]
"""A sample name and its label names, sorted."""


def families(text: str) -> dict[str, str]:
    """Family name -> type, as the parser reads them (a counter's family name has no
    `_total`; its samples do). Raises ValueError on a line the parser cannot read."""
    return {fam.name: fam.type for fam in text_string_to_metric_families(text)}


def series(text: str) -> set[Series]:
    """Every (sample name, label names) the page exposes."""
    return {
        (s.name, tuple(sorted(s.labels)))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value for every sample of the page."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the sample `name` with exactly these labels; KeyError if absent."""
    return samples(text)[(name, frozenset(labels.items()))]


def label_values(text: str) -> set[str]:
    """Every label value on the page."""
    return {
        value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        for value in s.labels.values()
    }
