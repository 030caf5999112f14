"""Pods whose CSI driver has not registered on this node yet wait for it (`PodPending`).

The kubelet accepts such a pod and retries its mount until the driver
registers; volfsm records it pending (`CSI driver D: not registered on this
node yet`) and resolves it again when the driver registers
(`plan_wake_drivers`). What no registration can fix stays refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from events.types import PodAdded, PodPending
from projections.validate import validate
from tests.desired.builders import Recorder, pod, pv, pvc
from volfsm.desired import DesiredStateOfWorld, InvalidObjectError
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.scripted import ScriptedPlugin

DRIVER = "secrets-store.csi.k8s.io"
INLINE = {
    "name": "secrets",
    "csi": {
        "driver": DRIVER,
        "readOnly": True,
        "volumeAttributes": {"secretProviderClass": "app-secrets"},
    },
}
WAITING = f"secrets: CSI driver {DRIVER}: not registered on this node yet"


@pytest.fixture
def catalog() -> PluginCatalog:
    found = PluginCatalog()
    found.register(ScriptedPlugin(plugin_name="kubernetes.io/empty-dir"))
    return found


@pytest.fixture
def dsw(catalog: PluginCatalog) -> DesiredStateOfWorld:
    return DesiredStateOfWorld(catalog.can_serve)


@pytest.fixture
def rec(dsw: DesiredStateOfWorld) -> Recorder:
    return Recorder(dsw)


def register(catalog: PluginCatalog, driver: str = DRIVER) -> None:
    catalog.register_csi_driver(driver, ScriptedPlugin(driver=driver))


def test_an_inline_volume_of_an_unregistered_driver_waits(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    plan = rec.apply(pod(volumes=[INLINE, {"name": "tmp", "emptyDir": {}}]))
    [result] = plan.results
    assert (result.action, result.waiting) == ("created", WAITING)
    [pending] = dsw.pending.values()
    [wait] = pending.waiting
    assert (wait.waits_for, wait.reason) == (
        f"CSI driver {DRIVER}",
        "not registered on this node yet",
    )
    assert dsw.pods == {} and dsw.volumes_to_mount() == []


def test_the_registration_resolves_the_pod(
    catalog: PluginCatalog, dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    rec.apply(pod(volumes=[INLINE]))
    assert dsw.plan_wake_drivers([DRIVER]) == []  # not registered yet: nothing changes
    register(catalog, "other.csi.example.com")
    assert dsw.plan_wake_drivers(["other.csi.example.com"]) == []  # waits for another
    register(catalog)
    rec.record(dsw.plan_wake_drivers([DRIVER]))
    assert dsw.pending == {}
    [(added, vol)] = dsw.volumes_to_mount()
    assert (added.pod_uid, vol.source.driver, vol.read_only) == ("uid-web", DRIVER, True)
    assert [type(e.body) for e in rec.envelopes] == [PodPending, PodAdded]
    assert validate(rec.envelopes).ok
    assert dsw.plan_wake_drivers([DRIVER]) == []  # once


def test_a_pv_of_an_unregistered_driver_is_accepted_and_its_pod_waits(
    catalog: PluginCatalog, dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    claim_volume = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
    plan = rec.apply(pv(driver=DRIVER), pvc("data"), pod(volumes=[claim_volume]))
    assert [r.action for r in plan.results] == ["created", "created", "created"]
    [wait] = dsw.pending["uid-web"].waiting
    assert wait.text == f"CSI driver {DRIVER}: not registered on this node yet"
    assert wait.needs == ("PersistentVolumeClaim default/data", "PersistentVolume pv-data")
    register(catalog)
    rec.record(dsw.plan_wake_drivers([DRIVER]))
    [(_, vol)] = dsw.volumes_to_mount()
    assert (vol.pv_name, vol.claim_name) == ("pv-data", "data")


def test_what_no_registration_fixes_is_still_refused(
    catalog: PluginCatalog, dsw: DesiredStateOfWorld
) -> None:
    register(catalog)
    block_pv: dict[str, Any] = pv(driver=DRIVER, mode="Block")
    with pytest.raises(InvalidObjectError, match="cannot serve volumeMode Block"):
        dsw.plan_apply([block_pv])
    bad = dict(INLINE, csi={"driver": "../../etc"})
    with pytest.raises(InvalidObjectError, match=r"spec\.volumes\[0\]\.csi\.driver"):
        dsw.plan_apply([pod(volumes=[bad])])
