"""A mount's last transition (VolumeMounted) and its OperationSucceeded are one append."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from events.streams import podvol_stream
from events.types import Body, Envelope
from volfsm.errors import IllegalTransitionError
from volfsm.plugins.scripted import ScriptedPlugin

from .conftest import EngineFactory
from .helpers import failures, types_of
from .objects import claim_volume, pod, pv_set

STREAM = podvol_stream("u1", "data")


async def test_a_mounts_last_transition_and_its_outcome_are_appended_together(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin)
    appends: list[list[str]] = []
    engine.handler.subscribe(
        lambda envs: appends.append([e.type for e in envs if e.stream == STREAM])
    )
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.settle()
    assert types_of(engine.log, STREAM) == [
        "OperationStarted",
        "VolumeMounted",
        "OperationSucceeded",
    ]
    assert ["VolumeMounted", "OperationSucceeded"] in appends  # one append, one listener call


async def test_a_refused_last_transition_is_the_operations_failure_never_a_success(
    make_engine: EngineFactory, plugin: ScriptedPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await make_engine(plugin)
    fire_async = engine.handler.fire_async
    refused: list[str] = []

    async def refuse_first_mount(
        stream: str, trigger: str, body: Body, then: Sequence[Body] = ()
    ) -> list[Envelope]:
        if trigger == "mount" and not refused:
            refused.append(stream)
            raise IllegalTransitionError(stream, "VolumeUnmounted", trigger, "refused by the test")
        return await fire_async(stream, trigger, body, then)

    monkeypatch.setattr(engine.handler, "fire_async", refuse_first_mount)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=10)  # the retry after the backoff
    await engine.settle()
    assert refused == [STREAM]
    assert types_of(engine.log, STREAM) == [
        "OperationStarted",
        "OperationFailed",
        "OperationStarted",
        "VolumeMounted",
        "OperationSucceeded",
    ]
    failed = failures(engine.log, "volume_mount")
    assert len(failed) == 1 and failed[0].code == "Unknown"
    assert "refused by the test" in failed[0].message and not failed[0].final
