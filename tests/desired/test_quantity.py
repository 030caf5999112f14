"""Kubernetes quantity parsing."""

from __future__ import annotations

from fractions import Fraction

import pytest

from volfsm.desired.quantity import format_bytes, parse_quantity, quantity_to_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1Gi", 1024**3),
        ("500Mi", 500 * 1024**2),
        ("10G", 10 * 10**9),
        ("1e9", 10**9),
        ("1E9", 10**9),
        ("1e+3", 1000),
        ("128974848", 128974848),
        ("129e6", 129_000_000),
        ("123Mi", 123 * 1024**2),
        ("1.5Gi", 3 * 1024**3 // 2),
        ("1Ki", 1024),
        ("1k", 1000),
        ("2Ti", 2 * 1024**4),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1Ei", 1024**6),
        ("0", 0),
        (".5Ki", 512),
        ("100m", 1),  # a tenth of a byte rounds up, as Kubernetes' Value() does
        ("1500m", 2),
        ("+7", 7),
        (1024, 1024),
        (1e9, 10**9),
        (2.5, 3),
    ],
)
def test_quantity_to_bytes(text: str | int | float, expected: int) -> None:
    assert quantity_to_bytes(text) == expected


def test_parse_quantity_is_exact() -> None:
    assert parse_quantity("100m") == Fraction(1, 10)
    assert parse_quantity("-1Ki") == -1024
    assert parse_quantity("1e-3") == Fraction(1, 1000)


@pytest.mark.parametrize(
    "bad",
    ["", "Gi", "1gi", "1GB", "1 Gi", "1.2.3", "1e", "e9", "abc", "1Gi ", "0x10", "1_000", "--1"],
)
def test_invalid_quantities_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity(bad)


def test_negative_storage_is_rejected() -> None:
    with pytest.raises(ValueError, match="negative"):
        quantity_to_bytes("-1Gi")


def test_out_of_range_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="exponent out of range"):
        parse_quantity("1e999999999")
    with pytest.raises(ValueError, match="too large"):
        quantity_to_bytes("9Ei")
    with pytest.raises(ValueError, match="too long"):
        parse_quantity("1" * 100)
    with pytest.raises(ValueError, match="not finite"):
        parse_quantity(float("inf"))


def test_non_quantity_types_are_rejected() -> None:
    with pytest.raises(ValueError, match="expected a quantity"):
        parse_quantity(True)
    with pytest.raises(ValueError, match="expected a quantity"):
        parse_quantity([1])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("size", "text"), [(1024**3, "1Gi"), (1536 * 1024**2, "1536Mi"), (7, "7"), (0, "0")]
)
def test_format_bytes(size: int, text: str) -> None:
    assert format_bytes(size) == text
