"""Kubernetes resource quantities ("1Gi", "500Mi", "10G", "1e9", 1024) as byte counts."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?P<suffix>[KMGTPE]i|[eE][+-]?\d+|[numkMGTPE])?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_TEXT = 64
_MAX_EXPONENT = 30
INT64_MAX = 2**63 - 1


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a quantity. Raises ValueError naming what is wrong."""
    if isinstance(value, bool):
        raise ValueError(f"expected a quantity, got {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"quantity {value!r} is not finite")
        return Fraction(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a quantity, got {type(value).__name__}")
    if len(value) > _MAX_TEXT:
        raise ValueError(f"quantity {value[:_MAX_TEXT]!r}... is too long")
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(
            f"invalid quantity {value!r} (expected a number with an optional suffix: "
            "Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent like e9)"
        )
    number = Fraction(match["number"])
    if match["sign"] == "-":
        number = -number
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * (1 << (10 * _BINARY[suffix]))
    if suffix in _DECIMAL:
        return number * Fraction(10) ** _DECIMAL[suffix]
    if suffix:
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"quantity {value!r}: exponent out of range")
        return number * Fraction(10) ** exponent
    return number


@lru_cache(maxsize=4096, typed=True)
def quantity_to_bytes(value: str | int | float) -> int:
    """A non-negative quantity as whole bytes, fractions rounded up as Kubernetes does."""
    exact = parse_quantity(value)
    if exact < 0:
        raise ValueError(f"quantity {value!r} is negative")
    result = math.ceil(exact)
    if result > INT64_MAX:
        raise ValueError(f"quantity {value!r} is too large")
    return result


def format_bytes(size: int) -> str:
    """A byte count in the largest binary unit that divides it ("1Gi", "1536Mi", "7")."""
    for suffix, power in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
        unit = 1024**power
        if size and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)
