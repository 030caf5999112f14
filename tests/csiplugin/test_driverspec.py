"""What a CSIDriver object makes the CSI plugin do: lifecycle modes, pod info, tokens, fsGroup."""

from __future__ import annotations

import json

import jwt
import pytest

from events.types import VolumeSource
from volfsm.desired.kinds import CSIDriverSpec, TokenRequest
from volfsm.plugins.base import VolumeRequest
from volfsm.plugins.csi import driverspec
from volfsm.plugins.objectvol.tokens import LocalSigner, TokenError, TokenManager


def req(**fields: object) -> VolumeRequest:
    source = fields.pop("source", VolumeSource(plugin="kubernetes.io/csi", driver="d.example"))
    base: dict[str, object] = {
        "volume_id": "v",
        "source": source,
        "pod_uid": "uid-1",
        "pod_name": "web",
        "pod_namespace": "apps",
        "service_account": "builder",
    }
    return VolumeRequest(**{**base, **fields})  # type: ignore[arg-type]


def test_lifecycle_modes_as_the_kubelet_checks_them() -> None:
    assert driverspec.lifecycle_problem(None, "d", ephemeral=False) is None
    assert "(no CSIDriver object)" in str(driverspec.lifecycle_problem(None, "d", ephemeral=True))
    persistent_only = CSIDriverSpec()
    assert "(only supports [Persistent])" in str(
        driverspec.lifecycle_problem(persistent_only, "d", ephemeral=True)
    )
    inline_only = CSIDriverSpec(volume_lifecycle_modes=("Ephemeral",))
    assert driverspec.lifecycle_problem(inline_only, "d", ephemeral=True) is None
    assert driverspec.lifecycle_problem(inline_only, "d", ephemeral=False) is not None


def test_pod_info_keys() -> None:
    assert driverspec.pod_info_context(req(ephemeral=False)) == {
        "csi.storage.k8s.io/pod.name": "web",
        "csi.storage.k8s.io/pod.namespace": "apps",
        "csi.storage.k8s.io/pod.uid": "uid-1",
        "csi.storage.k8s.io/serviceAccount.name": "builder",
        "csi.storage.k8s.io/ephemeral": "false",
    }


def test_token_requests_give_one_bound_token_per_audience(tmp_path: object) -> None:
    signer = LocalSigner(None, issuer="test")
    spec = CSIDriverSpec(
        token_requests=(
            TokenRequest(audience="vault"),
            TokenRequest(audience="", expiration_seconds=600),
        )
    )
    context = driverspec.token_context(spec, req(), TokenManager(signer).get)
    tokens = json.loads(context[driverspec.TOKENS])
    assert sorted(tokens) == ["", "vault"]
    claims = jwt.decode(tokens["vault"]["token"], options={"verify_signature": False})
    assert claims["aud"] == ["vault"]
    assert claims["kubernetes.io"]["pod"] == {"name": "web", "uid": "uid-1"}
    assert claims["sub"] == "system:serviceaccount:apps:builder"
    assert tokens[""]["expirationTimestamp"].endswith("Z")
    assert driverspec.token_context(CSIDriverSpec(), req(), None) == {}
    with pytest.raises(TokenError):
        driverspec.token_context(spec, req(), None)


@pytest.mark.parametrize(
    ("policy", "fs_type", "modes", "ephemeral", "read_only", "applies"),
    [
        ("ReadWriteOnceWithFSType", "ext4", ("ReadWriteOnce",), False, False, True),
        ("ReadWriteOnceWithFSType", "", ("ReadWriteOnce",), False, False, False),
        ("ReadWriteOnceWithFSType", "ext4", ("ReadWriteMany",), False, False, False),
        ("ReadWriteOnceWithFSType", "ext4", (), True, False, True),
        ("File", "", ("ReadWriteMany",), False, False, True),
        ("File", "", (), False, True, False),
        ("None", "ext4", ("ReadWriteOnce",), False, False, False),
    ],
)
def test_fs_group_policy(
    policy: str,
    fs_type: str,
    modes: tuple[str, ...],
    ephemeral: bool,
    read_only: bool,
    applies: bool,
) -> None:
    source = VolumeSource(plugin="kubernetes.io/csi", fs_type=fs_type, access_modes=modes)
    request = req(source=source, fs_group=5, ephemeral=ephemeral, read_only=read_only)
    spec = CSIDriverSpec(fs_group_policy=policy)  # type: ignore[arg-type]
    assert driverspec.applies_fs_group(spec, request) is applies
    assert driverspec.applies_fs_group(spec, req(source=source)) is False  # no fsGroup
