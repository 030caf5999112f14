"""podCertificate sources issued by `serve --cert-command` through a real `volfsm serve`.

One service for the module, its signer tests/helpers/certsigner.py (a test CA
made here) and `--node-allocatable memory=300Mi`. In order: a pod without a
memory limit gets its credential bundle on a tmpfs of the node's allocatable
memory, and a new key and certificate at the signer's beginRefreshAt; a
volume whose signer prints no PEM, a certificate for another key, an expired
one, a private key, or fails, makes the pod wait with each problem named; no
private key text is in the log, the service's output or the data dir.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from events.types import OperationFailed, OperationStarted, VolumeMounted
from tests.helpers import certsigner
from tests.service.helpers import ServeProcess, cli, unmount_under, until
from volfsm.node import mounts
from volfsm.node.atomicwriter import read_payload

ALLOCATABLE_MIB = 300
BAD_SIGNERS = {
    "garbage": "it printed no PEM CERTIFICATE block",
    "wrong-key": "the leaf certificate is not for the node's key",
    "expired": "the leaf certificate expired at ",
    "private-key": "PEM block 1 is a PRIVATE KEY block, not a CERTIFICATE",
    "fail": f"exited 3: {certsigner.FAIL_LINE}",
}


def _cert_source(signer: str, path: str, **paths: str) -> dict[str, Any]:
    return {
        "podCertificate": {
            "signerName": f"example.com/{signer}",
            "keyType": "ECDSAP256",
            "credentialBundlePath": path,
            **paths,
        }
    }


def _pod(name: str, sources: list[dict[str, Any]]) -> str:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {
            "serviceAccountName": "builder",
            "containers": [{"name": "main"}],  # no memory limit
            "volumes": [{"name": "cert", "projected": {"sources": sources}}],
        },
    }
    return yaml.safe_dump(pod)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, x509.Certificate]:
    path = tmp_path_factory.mktemp("signer") / "ca.pem"
    return path, certsigner.make_ca(path)


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, ca: tuple[Path, x509.Certificate]
) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("podcert")
    command = f"{sys.executable} {certsigner.__file__} {ca[0]}"
    service = ServeProcess(
        tmp / "svc",
        args=[
            "--cert-command",
            command,
            "--node-allocatable",
            f"memory={ALLOCATABLE_MIB}Mi",
        ],
    )
    service.workdir.mkdir()
    try:
        service.start()
        yield service
    finally:
        service.kill()
        unmount_under(tmp)


def events(svc: ServeProcess) -> list[Any]:
    with svc.open_log() as log:
        return [env.body for env in log.read_after(0)]


def cert_dir(svc: ServeProcess, name: str) -> Path:
    return svc.root_dir / "pods" / f"uid-{name}" / "volumes" / "kubernetes.io~projected" / "cert"


KEYS_SEEN: list[bytes] = []


def test_cert_command_bundle_on_a_sized_tmpfs_and_its_refresh(
    svc: ServeProcess, ca: tuple[Path, x509.Certificate]
) -> None:
    paths = {"keyPath": "key.pem", "certificateChainPath": "chain.pem"}
    code, out, err = cli(
        svc, "apply", "-f", "-", stdin=_pod("good", [_cert_source("short", "bundle.pem", **paths)])
    )
    assert code == 0, out + err
    code, out, err = cli(svc, "wait", "pod", "default/good", "--for", "mounted", "--timeout", "60")
    assert code == 0, out + err
    vol = cert_dir(svc, "good")
    files = read_payload(vol)
    assert files["bundle.pem"] == files["key.pem"] + files["chain.pem"]
    leaf, root = x509.load_pem_x509_certificates(files["chain.pem"])
    assert root == ca[1]
    leaf.verify_directly_issued_by(ca[1])
    private = serialization.load_pem_private_key(files["key.pem"], password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    assert leaf.public_key().public_bytes(der, spki) == private.public_key().public_bytes(der, spki)
    KEYS_SEEN.append(files["key.pem"])

    # the wrapped memory emptyDir's size: no pod memory limit, so the node's allocatable
    found = mounts.find_mount(vol)
    assert found is not None and found.fstype == "tmpfs"
    assert found.super_option("size") == f"{ALLOCATABLE_MIB * 1024}k"
    st = os.statvfs(vol)
    assert st.f_blocks * st.f_frsize == ALLOCATABLE_MIB << 20

    refreshed = until(
        "a new key at beginRefreshAt",
        lambda: (k := read_payload(vol)["key.pem"]) != files["key.pem"] and k,
    )
    KEYS_SEEN.append(refreshed)
    written = [
        b.contents
        for b in events(svc)
        if isinstance(b, VolumeMounted) and b.pod_uid == "uid-good" and b.volume_name == "cert"
    ]
    assert sum(c.startswith("written: podCertificate example.com/short ") for c in written) >= 2


def test_bad_signer_output_makes_the_pod_wait_naming_each_problem(svc: ServeProcess) -> None:
    sources = [_cert_source(signer, f"{signer}.pem") for signer in BAD_SIGNERS]
    code, out, err = cli(svc, "apply", "-f", "-", stdin=_pod("bad", sources))
    assert code == 0, out + err

    def failure() -> str:
        bodies = events(svc)
        ops = {
            b.op_id for b in bodies if isinstance(b, OperationStarted) and b.pod_uid == "uid-bad"
        }
        found = [b.message for b in bodies if isinstance(b, OperationFailed) and b.op_id in ops]
        return found[-1] if found else ""

    message = until("the volume failing", failure)
    for index, problem in enumerate(BAD_SIGNERS.values()):
        assert f"sources[{index}]: podCertificate: --cert-command " in message
        assert problem in message, message
    assert "-----" not in message
    assert not cert_dir(svc, "bad").joinpath("garbage.pem").exists()


def test_no_private_key_text_outside_the_tmpfs(svc: ServeProcess) -> None:
    assert len(KEYS_SEEN) == 2
    needles = [b"BEGIN PRIVATE KEY"]
    for key in KEYS_SEEN:
        needles += [line for line in key.splitlines() if not line.startswith(b"-----")]
    for text in (svc.data_dir / "volfsm.db").read_bytes(), svc.stderr_path.read_bytes():
        assert not any(n in text for n in needles)
    for path in svc.data_dir.rglob("*"):
        if path.is_file():
            assert not any(n in path.read_bytes() for n in needles[1:]), path
