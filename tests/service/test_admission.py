"""ServiceAccount admission at apply through a real `volfsm serve`: a pod taken as the
documentation writes it (no uid, no volumes) gets the API server's kube-api-access-* token
volume, mounted as the kubelet mounts it, and its namespace a kube-root-ca.crt ConfigMap
from --root-ca-file, which an applied one replaces.

One service for the module; the tests run in order as one story.
"""

from __future__ import annotations

import datetime
import json
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from events.types import ObjectApplied, VolumeMounted
from tests.service.helpers import ServeProcess, cli, unmount_under, until
from volfsm.desired.admission import api_access_name
from volfsm.node import mounts
from volfsm.node.atomicwriter import DATA_DIR, TS_DIR_RE, read_payload
from volfsm.service.config import ConfigError, settings_from

UID = re.compile(r"^pod/(\S+)/(\S+) (?:created|unchanged) \(uid ([0-9a-f-]{36})\)$", re.M)
OPERATOR_CA = "-----BEGIN CERTIFICATE-----\nMIIBoperator\n-----END CERTIFICATE-----\n"


def docs_pod(name: str, namespace: str = "", **spec: Any) -> dict[str, Any]:
    """The documentation's first pod: one container, no uid, no volumes."""
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    containers = [{"name": "nginx", "image": "nginx:1.14.2", "ports": [{"containerPort": 80}]}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": containers, **spec},
    }


def cluster_ca() -> str:
    """A self-signed CA certificate as PEM, with a comment line as bundles carry."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return "# kubernetes\n" + cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.crt"
    path.write_text(cluster_ca())
    return path


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, ca_file: Path) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("admission")
    proc = ServeProcess(tmp / "svc", args=["--root-ca-file", str(ca_file)])
    proc.workdir.mkdir()
    try:
        proc.start()
        yield proc
    finally:
        proc.kill()
        unmount_under(tmp)


def apply(svc: ServeProcess, name: str, *objects: dict[str, Any]) -> str:
    path = svc.workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    code, out, err = cli(svc, "apply", "-f", str(path))
    assert code == 0, out + err
    return out


def uid_of(out: str, pod: str) -> str:
    found = {f"{ns}/{name}": uid for ns, name, uid in UID.findall(out)}
    return found[pod]


def token_dir(svc: ServeProcess, uid: str) -> Path:
    projected = svc.root_dir / "pods" / uid / "volumes" / "kubernetes.io~projected"
    return projected / api_access_name(uid)


def mounted(svc: ServeProcess, pod: str) -> None:
    code, out, err = cli(svc, "wait", "pod", pod, "--for", "mounted", "--timeout", "30")
    assert code == 0, out + err


def stored(svc: ServeProcess, key: str) -> dict[str, Any]:
    code, out, err = cli(svc, "get", "configmaps", key, "-o", "json")
    assert code == 0, out + err
    found: dict[str, Any] = json.loads(out)["items"][0]["object"]
    return found


def test_a_docs_pod_gets_the_token_volume_as_the_kubelet_mounts_it(
    svc: ServeProcess, ca_file: Path
) -> None:
    out = apply(svc, "nginx", docs_pod("nginx"))
    uid = uid_of(out, "default/nginx")
    volume = api_access_name(uid)
    assert f"pod/default/nginx: added volume {volume} (service-account token at " in out
    assert (
        "configmap/default/kube-root-ca.crt created (published by volfsm from "
        f"--root-ca-file {ca_file})" in out
    )
    mounted(svc, "default/nginx")
    vol = token_dir(svc, uid)
    found = mounts.find_mount(vol)
    assert found is not None and found.fstype == "tmpfs"
    ts_dir = (vol / DATA_DIR).readlink()
    assert TS_DIR_RE.match(str(ts_dir))
    assert sorted(p.name for p in vol.iterdir()) == sorted(
        [DATA_DIR, str(ts_dir), "ca.crt", "namespace", "token"]
    )
    for name in ("ca.crt", "namespace", "token"):
        assert (vol / name).readlink() == Path(DATA_DIR) / name
        assert stat.S_IMODE((vol / ts_dir / name).stat().st_mode) == 0o644  # defaultMode 420
    files = read_payload(vol)
    assert files["ca.crt"] == ca_file.read_bytes()
    assert files["namespace"] == b"default"
    claims = jwt.decode(files["token"], options={"verify_signature": False})
    assert claims["sub"] == "system:serviceaccount:default:default"
    assert claims["exp"] - claims["iat"] == 3607
    assert claims["kubernetes.io"]["pod"] == {"name": "nginx", "uid": uid}
    config_map = stored(svc, "default/kube-root-ca.crt")
    assert config_map["metadata"]["annotations"]["volfsm.io/published-by"] == "volfsm"
    # the log says which version of it the pod mounted
    with svc.open_log() as log:
        events = list(log.read_after(0))
    [published] = [
        e.body
        for e in events
        if isinstance(e.body, ObjectApplied) and e.body.name == "kube-root-ca.crt"
    ]
    contents = [
        e.body.contents
        for e in events
        if isinstance(e.body, VolumeMounted) and e.body.volume_name == volume
    ]  # a remount asked for while the first mount ran may follow it
    assert contents[0].startswith("written: ")
    assert all(f"ConfigMap default/kube-root-ca.crt uid={published.uid} rv=" in c for c in contents)


def test_applying_the_same_pod_again_changes_nothing(svc: ServeProcess) -> None:
    # the account says no automount now: the API server admits a pod once, at its creation
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "default"},
        "automountServiceAccountToken": False,
    }
    apply(svc, "account", account)
    out = apply(svc, "nginx-again", docs_pod("nginx"))
    assert re.search(r"^pod/default/nginx unchanged \(uid ", out, re.M), out
    assert "added volume" not in out and "kube-root-ca.crt" not in out
    # a new pod of that account gets no token volume
    out = apply(svc, "quiet", docs_pod("quiet"))
    assert "added volume" not in out
    mounted(svc, "default/quiet")
    assert not token_dir(svc, uid_of(out, "default/quiet")).parent.exists()


def test_an_applied_kube_root_ca_replaces_volfsms_and_is_mounted(
    svc: ServeProcess, ca_file: Path
) -> None:
    out = apply(svc, "team-pod", docs_pod("worker", "team"))
    uid = uid_of(out, "team/worker")
    mounted(svc, "team/worker")
    vol = token_dir(svc, uid)
    assert read_payload(vol)["ca.crt"] == ca_file.read_bytes()
    own = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kube-root-ca.crt", "namespace": "team"},
        "data": {"ca.crt": OPERATOR_CA},
    }
    out = apply(svc, "team-ca", own)
    assert out.strip() == "configmap/team/kube-root-ca.crt configured"
    until(
        "the operator's ca.crt mounted", lambda: read_payload(vol)["ca.crt"] == OPERATOR_CA.encode()
    )
    # volfsm never touches it again: another pod of the namespace mounts the operator's
    out = apply(svc, "team-pod-2", docs_pod("helper", "team"))
    assert "kube-root-ca.crt" not in out
    mounted(svc, "team/helper")
    assert (
        read_payload(token_dir(svc, uid_of(out, "team/helper")))["ca.crt"] == OPERATOR_CA.encode()
    )
    config_map = stored(svc, "team/kube-root-ca.crt")
    assert config_map["data"] == {"ca.crt": OPERATOR_CA}
    assert "annotations" not in config_map["metadata"]


def test_a_new_root_ca_file_is_published_again_at_start(svc: ServeProcess, ca_file: Path) -> None:
    out = apply(svc, "nginx-uid", docs_pod("nginx"))
    vol = token_dir(svc, uid_of(out, "default/nginx"))
    new_ca = cluster_ca()
    new_file = ca_file.with_name("rotated.crt")
    new_file.write_text(new_ca)
    svc.stop()
    svc.args = ["--root-ca-file", str(new_file)]
    svc.start()
    assert stored(svc, "default/kube-root-ca.crt")["data"] == {"ca.crt": new_ca}
    until("the new ca.crt mounted", lambda: read_payload(vol)["ca.crt"] == new_ca.encode())
    assert stored(svc, "team/kube-root-ca.crt")["data"] == {"ca.crt": OPERATOR_CA}  # not ours


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("not a certificate\n", "must contain at least one PEM CERTIFICATE block"),
        (
            "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n",
            "block 0 is a PRIVATE KEY, only CERTIFICATE blocks are allowed",
        ),
        (
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            "holds a certificate that does not parse",
        ),
    ],
)
def test_root_ca_file_must_hold_pem_certificates(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "ca.crt"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        settings_from({"data_dir": str(tmp_path), "root_ca_file": str(path)}, environ={})
    assert str(err.value).startswith(f"--root-ca-file (from the command line): {str(path)!r} ")
    assert problem in str(err.value)
