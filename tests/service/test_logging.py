"""Service logging: flat JSON lines (or human text) with node, stream, seq, operation."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest
from loguru import logger

from volfsm.service.logging import configure_logging


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    logger.remove()
    logger.configure(extra={})
    logger.add(sys.stderr)
    logging.basicConfig(handlers=[], force=True)


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_lines_are_flat_with_bound_fields() -> None:
    out = io.StringIO()
    configure_logging("INFO", node="n1", stream=out)
    logger.bind(stream="podvol/u/data", seq=42, operation="volume_mount").info("mounted {}", "x")
    logger.debug("not shown at INFO")
    [line] = lines(out)
    assert line["level"] == "INFO" and line["message"] == "mounted x"
    assert line["node"] == "n1" and line["stream"] == "podvol/u/data"
    assert line["seq"] == 42 and line["operation"] == "volume_mount"
    assert str(line["time"]).endswith("Z") and "T" in str(line["time"])
    assert line["logger"] == __name__


def test_stdlib_logging_and_exceptions_go_through_the_same_sink() -> None:
    out = io.StringIO()
    configure_logging("DEBUG", node="n1", stream=out)
    logging.getLogger("volfsm.engine.executor").warning("operation %s failed", "op-1")
    try:
        raise ValueError("bad")
    except ValueError:
        logger.exception("caught")
    first, second = lines(out)
    assert first["logger"] == "volfsm.engine.executor"
    assert first["message"] == "operation op-1 failed" and first["level"] == "WARNING"
    assert first["node"] == "n1"
    assert "ValueError: bad" in str(second["exception"])


def test_reserved_names_and_odd_values_do_not_break_a_line() -> None:
    out = io.StringIO()
    configure_logging("INFO", node="n1", stream=out, json_lines=True)
    logger.bind(message="shadow", level=object(), path=b"\xff").info("ok")
    [line] = lines(out)
    assert line["message"] == "ok" and line["extra_message"] == "shadow"
    assert str(line["extra_level"]).startswith("<object")


def test_human_text_on_a_terminal() -> None:
    out = FakeTty()
    configure_logging("INFO", node="n1", stream=out)
    logger.bind(seq=7).info("hello")
    text = out.getvalue()
    assert "hello" in text and "seq=7" in text and "n1" in text
    assert not text.lstrip().startswith("{")


def test_state_machine_callbacks_are_not_logged_but_their_warnings_are() -> None:
    from volfsm.fsm import PODVOL

    out = io.StringIO()
    configure_logging("INFO", node="n1", stream=out, json_lines=True)
    model = PODVOL.new_model("podvol/u1/data")
    assert PODVOL.decide(model, "mount", "VolumeMounted") == "Mounted"
    logging.getLogger("transitions.core").warning("a real problem")
    assert [line["message"] for line in lines(out)] == ["a real problem"]
