"""Generic ephemeral volumes: the claim <pod>-<volume>, controlled by the pod, as a PVC."""

from __future__ import annotations

from typing import Any

import pytest

from events.types import PodAdded, PodPending
from tests.desired.builders import can_serve, pod, pv, pvc
from volfsm.desired import DesiredStateOfWorld
from volfsm.errors import InvalidObjectError

EPHEMERAL = {
    "name": "scratch",
    "ephemeral": {
        "volumeClaimTemplate": {
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            }
        }
    },
}


def owned_claim(owner_uid: str, *, controller: bool = True) -> dict[str, Any]:
    claim = pvc("web-scratch")
    claim["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "web",
            "uid": owner_uid,
            "controller": controller,
        }
    ]
    return claim


def test_the_pods_claim_is_used_as_a_persistent_volume_claim() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    volume = pv(claim=("default", "web-scratch"))
    plan = dsw.plan_apply([volume, owned_claim("uid-web"), pod(volumes=[EPHEMERAL])])
    [added] = [c.body for c in plan.changes if isinstance(c.body, PodAdded)]
    assert isinstance(added, PodAdded)
    [vol] = added.volumes
    assert (vol.name, vol.claim_name, vol.pv_name) == ("scratch", "web-scratch", "pv-data")
    assert vol.volume_id == "kubernetes.io/csi/hostpath.csi.example.com^vol-1"


def test_without_its_claim_the_pod_is_accepted_waiting_for_it() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    plan = dsw.plan_apply([pv(), pod(volumes=[EPHEMERAL])])
    [pending] = [c.body for c in plan.changes]
    assert isinstance(pending, PodPending)
    [waiting] = pending.waiting
    assert (waiting.name, waiting.waits_for) == (
        "scratch",
        "PersistentVolumeClaim default/web-scratch",
    )
    assert "volumeClaimTemplate" in waiting.reason
    assert "ownerReference to pod uid uid-web (controller: true)" in waiting.reason


def test_a_template_with_labels_and_no_name_is_accepted() -> None:
    # the documentation's shape: metadata with labels only (a name is not allowed there)
    template = {
        "metadata": {"labels": {"type": "scratch"}, "annotations": {"note": "x"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "scratch-class"},
    }
    labelled = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}}
    dsw = DesiredStateOfWorld(can_serve)
    volume = pv(claim=("default", "web-scratch"))
    plan = dsw.plan_apply([volume, owned_claim("uid-web"), pod(volumes=[labelled])])
    [added] = [c.body for c in plan.changes if isinstance(c.body, PodAdded)]
    assert isinstance(added, PodAdded) and added.volumes[0].claim_name == "web-scratch"


@pytest.mark.parametrize(("owner", "controller"), [("uid-other", True), ("uid-web", False)])
def test_a_claim_the_pod_does_not_control_is_refused(owner: str, controller: bool) -> None:
    dsw = DesiredStateOfWorld(can_serve)
    with pytest.raises(InvalidObjectError) as info:
        dsw.plan_apply([pv(), owned_claim(owner, controller=controller), pod(volumes=[EPHEMERAL])])
    assert "PVC default/web-scratch was not created for pod default/web (pod is not owner)" in str(
        info.value
    )
