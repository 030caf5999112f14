"""CSI ``requiresRepublish``: which mounted volumes to publish again.

The kubelet calls NodePublish again at each pod sync for a volume whose
driver's CSIDriver object sets ``requiresRepublish`` (so the driver can
refresh what it mounted, e.g. tokens); `volfsm serve` does it every
``--csi-republish-period`` through the engine's remount.
"""

from __future__ import annotations

from volfsm.desired.resolve import PLUGIN_CSI
from volfsm.engine import VolumeEngine


def republish_due(engine: VolumeEngine) -> dict[str, list[str]]:
    """Per desired pod uid, its CSI volumes whose driver requires republishing."""
    due: dict[str, list[str]] = {}
    for uid, pod in engine.dsw.pods.items():
        for dv in pod.volumes:
            if dv.source.plugin != PLUGIN_CSI or dv.volume_mode == "Block":
                continue
            driver = engine.objects.csi_driver(dv.source.driver)
            if driver is not None and driver.spec.requires_republish:
                due.setdefault(uid, []).append(dv.name)
    return due
