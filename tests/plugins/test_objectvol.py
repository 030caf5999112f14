"""The object-volume plugins on real dirs and a real object store (an engine's), and their parts.

The end-to-end story through `volfsm serve` is tests/service/test_object_volumes.py;
here: the downward API's formatting and resource arithmetic, projected errors
named at once, trust bundles, tokens and their refresh rule, reconstruction hooks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import jwt
import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from events.log import EventLog
from events.types import VolumeMounted
from tests.engine.helpers import eventually
from tests.helpers import certsigner
from tests.plugins.test_construct import Node, tmpfs_at
from volfsm.desired.objects import Pod
from volfsm.desired.volumes import ResourceFieldSelector
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.node import mounts
from volfsm.node.atomicwriter import read_payload
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import ConstructedSpec, PluginError, PodVolumeDir, VolumeRequest
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.objectvol.certs import (
    REFRESH_RETRY_S,
    CertError,
    CertKey,
    CertManager,
    CommandCertSource,
    Issued,
    LocalCA,
    PublicKey,
)
from volfsm.plugins.objectvol.command import CommandError, OperatorCommand
from volfsm.plugins.objectvol.downward import DownwardAPIError, go_quote, resource_value
from volfsm.plugins.objectvol.plugin import (
    ObjectVolumePlugin,
    ObjectVolumes,
    object_plugins,
    object_volume_id,
)
from volfsm.plugins.objectvol.tokens import (
    CommandTokenSource,
    LocalSigner,
    Token,
    TokenError,
    TokenKey,
    TokenManager,
)

PEM = "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n"


def test_go_quote_matches_strconv_quote() -> None:
    assert go_quote('say "hi"\n\ttab\\') == '"say \\"hi\\"\\n\\ttab\\\\"'
    assert go_quote("ü\x00\x7f") == '"ü\\x00\\x7f"'


def _pod(resources: dict[str, Any] | None = None) -> Pod:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources or {}}]}
    raw = {"metadata": {"name": "p", "uid": "u"}, "spec": spec}
    return msgspec.convert(raw, Pod)


@pytest.mark.parametrize(
    ("resource", "divisor", "want"),
    [
        ("limits.cpu", None, "2"),  # 1500m rounded up
        ("limits.cpu", "1m", "1500"),
        ("limits.memory", "1Mi", "3"),  # 2.5Mi rounded up
        ("requests.memory", None, "0"),  # unset request
        ("limits.ephemeral-storage", "1", "1000"),  # unset limit: node allocatable
    ],
)
def test_resource_field_ref_divides_and_rounds_up(
    resource: str, divisor: str | None, want: str
) -> None:
    pod = _pod({"limits": {"cpu": "1500m", "memory": "2560Ki"}})
    ref = ResourceFieldSelector(resource=resource, container_name="c", divisor=divisor)
    assert resource_value(pod, ref, {"ephemeral-storage": Fraction(1000)}) == want


def test_resource_field_ref_errors() -> None:
    pod = _pod()
    with pytest.raises(DownwardAPIError, match="container 'x' not found"):
        resource_value(pod, ResourceFieldSelector(resource="limits.cpu", container_name="x"), {})
    with pytest.raises(DownwardAPIError, match="unsupported resource"):
        resource_value(pod, ResourceFieldSelector(resource="limits.gpu", container_name="c"), {})


def test_token_refresh_rule_and_failure_keeps_the_cached_token() -> None:
    now = [1000.0]

    class Flaky:
        fail = False
        issued = 0

        def issue(self, key: TokenKey) -> Token:
            if self.fail:
                raise TokenError("down")
            self.issued += 1
            return Token(f"t{self.issued}", now[0], now[0] + key.expiration_seconds)

    source = Flaky()
    manager = TokenManager(source, clock=lambda: now[0])
    key = TokenKey("ns", "sa", (), 1000, "p", "u")
    first = manager.get(key)
    assert first.refresh_at() == 1800.0  # 80% of the lifetime
    now[0] = 1700.0
    assert manager.get(key) is first
    now[0] = 1801.0
    assert manager.get(key).text == "t2"
    source.fail = True
    now[0] = 2700.0
    kept = manager.get(key)
    assert kept.text == "t2"  # refresh failed, still valid: cached
    assert kept.refresh_at() == 2760.0  # retried a minute later, not at once
    calls = [0]
    real_issue = source.issue

    def counted(key: TokenKey) -> Token:
        calls[0] += 1
        return real_issue(key)

    source.issue = counted  # type: ignore[method-assign]
    now[0] = 2759.0
    assert manager.get(key).text == "t2" and calls[0] == 0  # no new try before the retry time
    now[0] = 2760.0
    assert manager.get(key).refresh_at() == 2801.0 and calls[0] == 1  # capped by the expiry
    now[0] = 2900.0
    with pytest.raises(TokenError, match="expired and refresh failed"):
        manager.get(key)


def test_local_signer_jwt_claims(tmp_path: Path) -> None:
    signer = LocalSigner(tmp_path / "k.pem", issuer="volfsm-node-local:n1")
    token = signer.issue(TokenKey("ns", "sa", ("vault",), 600, "p", "u"))
    claims = jwt.decode(token.text, signer.public_pem(), algorithms=["ES256"], audience="vault")
    assert claims["sub"] == "system:serviceaccount:ns:sa"
    assert claims["exp"] - claims["iat"] == 600
    assert oct(os.stat(tmp_path / "k.pem").st_mode & 0o777) == "0o600"
    again = LocalSigner(tmp_path / "k.pem", issuer="x")
    assert again.public_pem() == signer.public_pem()  # the key is kept across restarts


# ------------------------------------------------------- with a real store


@pytest.fixture
async def world(
    tmp_path: Path, layout: RootLayout
) -> AsyncIterator[tuple[VolumeEngine, dict[str, ObjectVolumePlugin]]]:
    shared = ObjectVolumes(allocatable={"cpu": Fraction(4)})
    plugins = object_plugins(layout, shared)
    catalog = PluginCatalog()
    for plugin in plugins:
        catalog.register(plugin)
    log = EventLog(tmp_path / "volfsm.db", node="n1")
    engine = VolumeEngine(log, layout.root, catalog, EngineConfig())
    shared.store = engine.objects
    await engine.start()
    try:
        yield engine, {p.name.split("/")[1]: p for p in plugins}
    finally:
        await engine.stop()
        log.close()


def _req(layout: RootLayout, plugin: ObjectVolumePlugin, name: str) -> VolumeRequest:
    vid = object_volume_id(plugin.name, "uid-p", name)
    spec = plugin.spec_from_volume_id(vid, "uid-p", name)
    assert spec is not None
    req = VolumeRequest(volume_id=vid, source=spec.source, pod_uid="uid-p", volume_name=name)
    return replace(req, mount_path=plugin.pod_mount_path(layout.root, req))


async def test_projected_problems_are_named_at_once_and_nothing_is_written(
    world: tuple[VolumeEngine, dict[str, ObjectVolumePlugin]], layout: RootLayout
) -> None:
    engine, plugins = world
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "uid": "uid-p"},
        "spec": {
            "volumes": [
                {
                    "name": "proj",
                    "projected": {
                        "sources": [
                            {"configMap": {"name": "absent"}},
                            {"secret": {"name": "absent-too"}},
                            {"clusterTrustBundle": {"path": "ca.pem", "name": "nobundle"}},
                            {
                                "clusterTrustBundle": {
                                    "path": "opt.pem",
                                    "name": "x",
                                    "optional": True,
                                }
                            },
                        ]
                    },
                }
            ]
        },
    }
    await engine.apply([pod])
    plugin = plugins["projected"]
    req = _req(layout, plugin, "proj")
    with pytest.raises(PluginError) as caught:
        await plugin.set_up(req)
    message = caught.value.message
    assert 'sources[0]: configmaps "absent" not found' in message
    assert 'sources[1]: secrets "absent-too" not found' in message
    assert "sources[2]: no ClusterTrustBundle found for nobundle" in message
    assert "sources[3]" not in message
    assert not Path(req.mount_path or "").exists()  # found before the node was touched


async def test_trust_bundle_by_signer_and_reconstruction(
    world: tuple[VolumeEngine, dict[str, ObjectVolumePlugin]], layout: RootLayout
) -> None:
    engine, plugins = world
    bundle = {
        "apiVersion": "certificates.k8s.io/v1beta1",
        "kind": "ClusterTrustBundle",
        "metadata": {"name": "example.com:ca:one", "labels": {"tier": "gold"}},
        "spec": {"signerName": "example.com/ca", "trustBundle": "# comment\n" + PEM + PEM},
    }
    source = {
        "path": "ca.pem",
        "signerName": "example.com/ca",
        "labelSelector": {"matchLabels": {"tier": "gold"}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "uid": "uid-p"},
        "spec": {
            "volumes": [{"name": "ctb", "projected": {"sources": [{"clusterTrustBundle": source}]}}]
        },
    }
    await engine.apply([bundle, pod])
    assert await engine.wait_pod("uid-p", "mounted", timeout=30) is not None
    plugin = plugins["projected"]
    req = _req(layout, plugin, "ctb")
    try:
        result = await plugin.set_up(req)  # a remount: nothing changed
        assert result.mount_found is True and result.contents.startswith("unchanged: ")
        assert read_payload(Path(req.mount_path or "")) == {"ca.pem": PEM.encode()}
        assert "ClusterTrustBundle /example.com:ca:one" in result.contents
        path = Path(req.mount_path or "")
        node = Node({str(path): tmpfs_at(path)})
        found = PodVolumeDir("uid-p", "volumes", "kubernetes.io~projected", "ctb", path, True)
        got = plugin.construct_volume_spec(layout, found, node)
        assert isinstance(got, ConstructedSpec)
        assert got.spec.volume_id == req.volume_id
        assert plugin.expected_pod_mount(got.spec) == "kubernetes.io/projected tmpfs"
    finally:
        assert await plugin.tear_down(req) is None
    assert mounts.find_mount(Path(req.mount_path or "")) is None
    assert not Path(req.mount_path or "").exists()


async def test_fs_group_applies_to_the_files_before_the_swap(
    world: tuple[VolumeEngine, dict[str, ObjectVolumePlugin]], layout: RootLayout
) -> None:
    engine, plugins = world
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c"},
        "data": {"k": "v"},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "uid": "uid-p"},
        "spec": {
            "securityContext": {"fsGroup": 2345},
            "volumes": [{"name": "cfg", "configMap": {"name": "c", "defaultMode": 0o600}}],
        },
    }
    mounted: list[VolumeMounted] = []
    engine.handler.subscribe(
        lambda envs: mounted.extend(e.body for e in envs if isinstance(e.body, VolumeMounted))
    )
    await engine.apply([config, pod])
    assert await engine.wait_pod("uid-p", "mounted", timeout=30) is not None
    plugin = plugins["configmap"]
    req = replace(_req(layout, plugin, "cfg"), fs_group=2345)
    try:
        path = Path(req.mount_path or "")
        st = os.stat(path / "k")
        assert (st.st_gid, st.st_mode & 0o7777) == (2345, 0o640)  # 0600 + the read-only 0440
        assert [m.ownership.split(":")[0] for m in mounted] == ["fsGroup 2345"]
        assert mounts.find_mount(path) is None  # configMap: on the node's disk
        assert os.stat(path).st_mode & 0o2000  # the fsGroup pass's setgid on the volume dir
        engine.remount("uid-p")  # nothing changed: nothing rewritten, the bits stay
        await eventually(lambda: len(mounted) == 2, "the remount")
        assert mounted[1].contents.startswith("unchanged")
        assert os.stat(path).st_mode & 0o2000 and os.stat(path).st_gid == 2345
    finally:
        await plugin.tear_down(req)
    assert not path.exists()


def test_token_command_gets_the_request_and_its_expiry_from_the_jwt(tmp_path: Path) -> None:
    signed = jwt.encode({"exp": 4_000_000_000, "sub": "x"}, "k" * 32, algorithm="HS256")
    script = tmp_path / "token.sh"
    script.write_text(f'#!/bin/sh\necho "$@ $VOLFSM_POD_UID" > {tmp_path}/args\necho {signed}\n')
    script.chmod(0o755)
    source = CommandTokenSource(f"{script} --flag")
    token = source.issue(TokenKey("ns", "sa", ("a", "b"), 900, "p", "u"))
    assert token.text == signed and token.expires_at == 4_000_000_000
    assert (tmp_path / "args").read_text() == "--flag ns sa a,b 900 u\n"
    script.write_text("#!/bin/sh\necho secret-looking-output >&2\nexit 3\n")
    with pytest.raises(TokenError, match="exited 3 with no token") as caught:
        source.issue(TokenKey("ns", "sa", (), 900, "p", "u"))
    assert "secret-looking-output" not in str(caught.value)


@pytest.mark.parametrize("key_type", ["ECDSAP256", "ED25519", "RSA3072"])
def test_pod_certificate_from_the_node_ca_and_its_renewal(tmp_path: Path, key_type: str) -> None:
    now = [time.time()]
    ca = LocalCA(tmp_path / "ca.pem", "n1")
    manager = CertManager(ca, clock=lambda: now[0])
    key = CertKey("ns", "web", "u", "sa", "example.com/pods", key_type, 3600, "bundle.pem")
    cred = manager.get(key)
    leaf, root = x509.load_pem_x509_certificates(cred.chain_pem)
    assert root.subject == ca.cert.subject and leaf.issuer == ca.cert.subject
    leaf.verify_directly_issued_by(root)
    private = serialization.load_pem_private_key(cred.key_pem, password=None)
    assert private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == leaf.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://volfsm.local/ns/ns/sa/sa"
    ]
    assert cred.not_after - cred.not_before == 3600
    assert manager.get(key) is cred
    now[0] = cred.refresh_at() + 1
    renewed = manager.get(key)
    assert renewed.key_pem != cred.key_pem  # a new key with each certificate
    assert LocalCA(tmp_path / "ca.pem", "n1").cert == ca.cert  # the CA is kept


def _spki_pem(key_pem: bytes) -> bytes:
    private = serialization.load_pem_private_key(key_pem, password=None)
    return private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _cert_key(signer: str, key_type: str = "ECDSAP256") -> CertKey:
    return CertKey("ns", "web", "u-1", "sa", signer, key_type, 86400, "b.pem", (("team", "a"),))


@pytest.fixture
def signer(tmp_path: Path) -> tuple[CommandCertSource, x509.Certificate, Path]:
    """A --cert-command source over tests/helpers/certsigner.py, its CA, its request record."""
    ca = certsigner.make_ca(tmp_path / "signer-ca.pem")
    record = tmp_path / "request.json"
    command = f"{sys.executable} {certsigner.__file__} {tmp_path / 'signer-ca.pem'} {record}"
    return CommandCertSource(command, "node-1"), ca, record


def test_cert_command_gets_the_request_and_its_chain(
    signer: tuple[CommandCertSource, x509.Certificate, Path],
) -> None:
    source, ca, record = signer
    cred = CertManager(source).get(_cert_key("example.com/good", "ED25519"))
    leaf, root = x509.load_pem_x509_certificates(cred.chain_pem)
    assert root == ca
    leaf.verify_directly_issued_by(ca)
    assert leaf.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == _spki_pem(cred.key_pem)
    assert cred.not_after - cred.not_before == 3600
    assert cred.refresh_at() == cred.not_before + 0.8 * 3600  # no hint: 80% of the lifetime
    request = json.loads(record.read_text())
    assert request["stdin"].encode() == _spki_pem(cred.key_pem)  # the public key only
    expected = {
        "VOLFSM_SIGNER_NAME": "example.com/good",
        "VOLFSM_NAMESPACE": "ns",
        "VOLFSM_POD_NAME": "web",
        "VOLFSM_POD_UID": "u-1",
        "VOLFSM_SERVICE_ACCOUNT": "sa",
        "VOLFSM_NODE_NAME": "node-1",
        "VOLFSM_MAX_EXPIRATION_SECONDS": "86400",
        "VOLFSM_KEY_TYPE": "ED25519",
        "VOLFSM_USER_ANNOTATIONS": '{"team": "a"}',
    }
    assert {name: request["env"].get(name) for name in expected} == expected
    short = CertManager(source).get(_cert_key("example.com/short"))
    assert short.refresh_at() == short.not_before + certsigner.SHORT_TTL // 2  # the signer's hint


@pytest.mark.parametrize(
    ("signer_name", "problem"),
    [
        ("example.com/garbage", "it printed no PEM CERTIFICATE block"),
        ("example.com/private-key", "PEM block 1 is a PRIVATE KEY block, not a CERTIFICATE"),
        ("example.com/wrong-key", "the leaf certificate is not for the node's key"),
        ("example.com/expired", "the leaf certificate expired at "),
        ("example.com/fail", f"exited 3: {certsigner.FAIL_LINE}"),
    ],
)
def test_cert_command_bad_output_fails_naming_the_problem_not_the_output(
    signer: tuple[CommandCertSource, x509.Certificate, Path], signer_name: str, problem: str
) -> None:
    source, _, _ = signer
    with pytest.raises(CertError) as caught:
        CertManager(source).get(_cert_key(signer_name))
    message = str(caught.value)
    assert message.startswith(f"--cert-command {sys.executable!r}") and problem in message
    assert "-----" not in message and "hello" not in message


def test_a_failed_cert_refresh_keeps_the_credential_until_it_expires() -> None:
    ca, down = LocalCA(None, "n1"), [False]

    class Flaky:
        def issue(self, key: CertKey, public_key: PublicKey) -> Issued:
            if down[0]:
                raise CertError("signer down")
            return ca.issue(key, public_key)

    now = [time.time()]
    manager = CertManager(Flaky(), clock=lambda: now[0])
    key = _cert_key("example.com/pods")
    cred = manager.get(key)
    down[0] = True
    now[0] = cred.refresh_at() + 1
    kept = manager.get(key)
    assert kept.key_pem == cred.key_pem and kept.refresh_at() == now[0] + REFRESH_RETRY_S
    now[0] = cred.not_after
    with pytest.raises(CertError, match=r"^certificate expired and refresh failed: signer down$"):
        manager.get(key)


def test_operator_command_is_killed_with_its_children_after_the_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"sh -c 'sleep 60 & echo $! > {pid_file}; wait'"
    command = OperatorCommand(script, "--cert-command", timeout_s=2.0)
    with pytest.raises(CommandError, match=r"^--cert-command 'sh' did not finish in 2s: killed$"):
        command.run()
    stat_path = Path(f"/proc/{int(pid_file.read_text())}/stat")

    def gone() -> bool:
        try:
            return stat_path.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(), "the command's child outlived the timeout"
