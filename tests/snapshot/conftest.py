"""Log records of the engine (loguru) reach pytest's `caplog` in these tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from loguru import logger


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """pytest's caplog, fed by loguru (the engine logs through loguru, not `logging`)."""
    sink = logger.add(caplog.handler, format="{message}", level=0)
    try:
        yield caplog
    finally:
        logger.remove(sink)
