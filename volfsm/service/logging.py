"""Service logging through loguru, configured once for the whole process.

On a terminal: one readable line per record. Otherwise (containers,
systemd, files, tests): one flat JSON object per line on stderr with
`time` (UTC ISO 8601, µs), `level`, `message`, `logger`, `node` and every
bound extra (`stream`, `seq`, `operation`, `verb`, ...) as top-level keys,
plus `exception` when there is one. loguru's own `serialize=True` nests
the record (`{"text":..., "record":{...}}`), which log shippers handle
badly, hence the sink here.

Standard-library `logging` (nats-py, grpc) is routed into the
same sink.
"""

from __future__ import annotations

import logging
import sys
import traceback
from datetime import UTC
from typing import Any, TextIO

import msgspec
from loguru import logger

_RESERVED = ("time", "level", "message", "logger")
_encoder = msgspec.json.Encoder(enc_hook=str)


def _json_line(record: Any) -> bytes:
    """One record as a flat JSON object (bytes, no newline)."""
    out: dict[str, Any] = {
        "time": record["time"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "level": record["level"].name,
        "message": record["message"],
        "logger": record["extra"].get("logger_name") or record["name"],
    }
    for key, value in record["extra"].items():
        if key == "logger_name":
            continue
        out[f"extra_{key}" if key in _RESERVED else key] = value
    exc = record["exception"]
    if exc is not None and exc.type is not None:
        out["exception"] = "".join(traceback.format_exception(exc.type, exc.value, exc.traceback))
    try:
        return _encoder.encode(out)
    except (TypeError, ValueError, OverflowError):
        return _encoder.encode({k: str(v) for k, v in out.items()})


class JsonSink:
    """A loguru sink writing flat JSON lines to a text stream."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, message: Any) -> None:
        self.stream.write(_json_line(message.record).decode() + "\n")
        self.stream.flush()


def _human_format(record: Any) -> str:
    extras = " ".join(
        f"{k}={{extra[{k}]}}" for k in record["extra"] if k not in ("node", "logger_name")
    )
    tail = f" <dim>{extras}</dim>" if extras else ""
    return (
        "<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
        "<cyan>{extra[node]}</cyan> {message}" + tail + "\n{exception}"
    )


class InterceptHandler(logging.Handler):
    """Send standard-library log records to loguru (the documented loguru recipe)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.bind(logger_name=record.name).opt(exception=record.exc_info).log(
            level, record.getMessage()
        )


def configure_logging(
    level: str = "INFO",
    *,
    node: str = "",
    json_lines: bool | None = None,
    stream: TextIO | None = None,
) -> None:
    """Log to `stream` (default stderr) as JSON lines, or human text on a terminal.

    `json_lines` forces the format; None picks by `stream.isatty()`. Safe to
    call again (tests do): it replaces the previous configuration.
    """
    out = stream if stream is not None else sys.stderr
    if json_lines is None:
        json_lines = not (hasattr(out, "isatty") and out.isatty())
    logger.remove()
    logger.configure(extra={"node": node})
    if json_lines:
        logger.add(JsonSink(out), level=level.upper(), backtrace=False, diagnose=False)
    else:
        logger.add(
            out,
            level=level.upper(),
            format=_human_format,
            colorize=True,
            backtrace=False,
            diagnose=False,
        )
    std_level = logging.DEBUG if level.upper() in ("TRACE", "DEBUG") else logging.INFO
    logging.basicConfig(handlers=[InterceptHandler()], level=std_level, force=True)
    # transitions logs every state callback at INFO; volfsm logs each transition itself.
    for noisy in ("asyncio", "grpc", "transitions"):
        logging.getLogger(noisy).setLevel(max(std_level, logging.WARNING))
