"""Fault injection for tests, driven by a JSON control file re-read on every call.

The file holds a list of rules (or ``{"rules": [...]}``)::

    {"rpc": "NodeStageVolume", "volume_id": "vol1", "action": "delay",
     "seconds": 1.5, "when": "before", "times": 1}

- ``rpc``: method name (e.g. ``NodeStageVolume``) or ``*`` for every method.
- ``volume_id``: optional; matches the volume id (the name for CreateVolume).
- ``action``: ``delay`` (sleep ``seconds``), ``error`` (fail with ``code`` and
  ``message``), ``hang`` (block until the client cancels; ``seconds`` > 0 caps
  it), ``crash`` (``os._exit(137)``) or ``abnormal`` (NodeGetVolumeStats only: the
  call succeeds but reports the volume condition abnormal, with ``message``).
- ``when``: ``before`` the real work (default) or ``after`` it, which models
  "the driver finished but the reply was lost".
- ``times``: how often the rule fires (default: always).

Fire counts are kept in ``<state_dir>/faults-fired.json`` so that a ``crash``
rule with ``times: 1`` does not fire again after the restart. They reset when
the control file changes (content or mtime).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from loguru import logger

from volfsm.csidriver.errors import CsiError
from volfsm.csidriver.state import write_json_atomic

ACTIONS = ("delay", "error", "hang", "crash", "abnormal")
ABNORMAL_RPC = "NodeGetVolumeStats"
"""The only call the ``abnormal`` action applies to (its reply carries the condition)."""
PHASES = ("before", "after")
CRASH_EXIT_CODE = 137


@dataclass(frozen=True)
class FaultRule:
    """One rule of the control file."""

    index: int
    rpc: str
    action: str
    volume_id: str | None = None
    when: str = "before"
    seconds: float = 0.0
    code: str = "UNAVAILABLE"
    message: str = ""
    times: int | None = None

    def matches(self, rpc: str, volume_id: str, when: str) -> bool:
        """Whether this rule applies to this call and phase."""
        return (
            self.rpc in (rpc, "*")
            and self.when == when
            and (self.volume_id is None or self.volume_id == volume_id)
        )


def parse_rule(index: int, raw: Any) -> FaultRule:
    """Validate one raw rule; raise ValueError with the reason if it is malformed."""
    if not isinstance(raw, dict):
        raise ValueError("a rule must be a JSON object")
    action = raw.get("action")
    when = raw.get("when", "before")
    if not isinstance(raw.get("rpc"), str) or not raw["rpc"]:
        raise ValueError("'rpc' must be a method name")
    if action not in ACTIONS:
        raise ValueError(f"'action' must be one of {ACTIONS}")
    if when not in PHASES:
        raise ValueError(f"'when' must be one of {PHASES}")
    if action == "abnormal" and raw["rpc"] not in (ABNORMAL_RPC, "*"):
        raise ValueError(f"'abnormal' applies to {ABNORMAL_RPC} only")
    code = str(raw.get("code", "UNAVAILABLE"))
    if code not in grpc.StatusCode.__members__ or code == "OK":
        raise ValueError(f"'code' {code!r} is not a gRPC error code name")
    times = raw.get("times")
    volume_id = raw.get("volume_id")
    return FaultRule(
        index=index,
        rpc=raw["rpc"],
        action=action,
        volume_id=str(volume_id) if volume_id is not None else None,
        when=when,
        seconds=float(raw.get("seconds", 0.0)),
        code=code,
        message=str(raw.get("message", "")),
        times=int(times) if times is not None else None,
    )


class FaultInjector:
    """Picks and applies the fault for a call, if the control file has one."""

    def __init__(self, control_file: Path | None, counts_file: Path, stopping: threading.Event):
        self._control_file = control_file
        self._counts_file = counts_file
        self._stopping = stopping
        self._mutex = threading.Lock()

    def _read(self) -> tuple[str, list[FaultRule]]:
        if self._control_file is None:
            return "", []
        try:
            st = self._control_file.stat()
            text = self._control_file.read_text()
        except FileNotFoundError:
            return "", []
        key = f"{hashlib.sha256(text.encode()).hexdigest()}:{st.st_mtime_ns}"
        if not text.strip():
            return key, []
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            logger.error("fault file {} is not valid JSON, ignored: {}", self._control_file, err)
            return key, []
        raw_rules = data.get("rules", []) if isinstance(data, dict) else data
        if not isinstance(raw_rules, list):
            logger.error("fault file {}: expected a list of rules", self._control_file)
            return key, []
        rules = []
        for index, raw in enumerate(raw_rules):
            try:
                rules.append(parse_rule(index, raw))
            except (ValueError, TypeError) as err:
                logger.error("fault file {}: rule {} ignored: {}", self._control_file, index, err)
        return key, rules

    def _load_counts(self, key: str) -> dict[str, int]:
        try:
            data = json.loads(self._counts_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        if not isinstance(data, dict) or data.get("key") != key:
            return {}
        fired = data.get("fired", {})
        return {str(k): int(v) for k, v in fired.items()} if isinstance(fired, dict) else {}

    def pick(self, rpc: str, volume_id: str, when: str) -> FaultRule | None:
        """The first matching rule that has not used up its ``times``; counts it as fired."""
        with self._mutex:
            key, rules = self._read()
            if not rules:
                return None
            counts = self._load_counts(key)
            for rule in rules:
                fired = counts.get(str(rule.index), 0)
                if not rule.matches(rpc, volume_id, when):
                    continue
                if rule.times is not None and fired >= rule.times:
                    continue
                counts[str(rule.index)] = fired + 1
                # Recorded before the fault acts, so a crash rule is counted too.
                write_json_atomic(self._counts_file, {"key": key, "fired": counts})
                return rule
            return None

    def apply(self, rule: FaultRule, rpc: str, is_active: Callable[[], bool]) -> None:
        """Act out a rule: sleep, raise the CsiError, block until cancelled, or exit."""
        logger.warning(
            "fault injected: {} {} {} (rule {})", rpc, rule.when, rule.action, rule.index
        )
        if rule.action == "delay":
            time.sleep(rule.seconds)
        elif rule.action == "error":
            message = rule.message or f"injected {rule.code} fault in {rpc}"
            raise CsiError(grpc.StatusCode[rule.code], message)
        elif rule.action == "hang":
            self._hang(rule, is_active)
            raise CsiError(grpc.StatusCode.CANCELLED, f"{rpc} hung by an injected fault")
        elif rule.action == "abnormal":
            return  # the caller marks the reply (`abnormal_condition`)
        elif rule.action == "crash":
            logger.complete()
            sys.stderr.flush()
            os._exit(CRASH_EXIT_CODE)

    def _hang(self, rule: FaultRule, is_active: Callable[[], bool]) -> None:
        deadline = time.monotonic() + rule.seconds if rule.seconds > 0 else None
        while is_active() and not self._stopping.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(0.05)


def abnormal_condition(rule: FaultRule | None, rpc: str, response: Any) -> None:
    """Mark a NodeGetVolumeStats reply abnormal if `rule` is an ``abnormal`` rule."""
    if rule is None or rule.action != "abnormal" or rpc != ABNORMAL_RPC:
        return
    condition = response.volume_condition
    condition.abnormal = True
    condition.message = rule.message or "injected abnormal volume condition"
