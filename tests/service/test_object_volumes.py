"""configMap, secret, downwardAPI and projected volumes end to end through a real `volfsm serve`.

One service for the module (tokens capped at 6 s with --token-max-ttl, so
refreshes come in seconds); the tests run in order as one story: a plain
manifest with no uid mounted, each plugin's content, modes and layout,
missing objects and keys, path escapes refused, a ConfigMap changed under a
reader, a token refreshed, no secret value anywhere but the object store and
the tmpfs, a restart and a SIGKILL mid-update converging.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml

from events.types import OperationFailed, OperationStarted, VolumeMounted
from tests.service.helpers import ServeProcess, cli, unmount_under, until
from volfsm.node import mounts
from volfsm.node.atomicwriter import DATA_DIR, TS_DIR_RE, read_payload

SECRET = "Pw-4711-never-logged-Xq"
TOKEN_TTL = 6
UID_LINE = re.compile(r"^pod/default/web (created|unchanged) \(uid ([0-9a-f-]{36})\)$", re.M)

OBJECTS = f"""\
apiVersion: v1
kind: ConfigMap
metadata: {{name: app-config}}
data:
  app.properties: "color=blue\\n"
  mode: fast
binaryData:
  blob.bin: {base64.b64encode(bytes(range(8))).decode()}
---
apiVersion: v1
kind: Secret
metadata: {{name: app-secret}}
stringData:
  password: {SECRET}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: kube-root-ca.crt}}
data:
  ca.crt: "not a real CA\\n"
"""

POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web, tier: "front"}
  annotations: {note: "say \\"hi\\""}
spec:
  serviceAccountName: builder
  containers:
  - name: main
    resources: {limits: {memory: 64Mi}, requests: {cpu: 250m}}
  volumes:
  - name: config
    configMap: {name: app-config}
  - name: config-items
    configMap:
      name: app-config
      defaultMode: 0640
      items:
      - {key: mode, path: deep/dir/mode.txt}
      - {key: app.properties, path: props, mode: 0600}
  - name: creds
    secret: {secretName: app-secret, defaultMode: 0400}
  - name: maybe
    configMap: {name: not-there, optional: true}
  - name: podinfo
    downwardAPI:
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - {path: tier, fieldRef: {fieldPath: "metadata.labels['tier']"}}
      - {path: annotations, fieldRef: {fieldPath: metadata.annotations}}
      - {path: uid, fieldRef: {fieldPath: metadata.uid}}
      - {path: mem, resourceFieldRef: {containerName: main, resource: limits.memory, divisor: 1Mi}}
      - path: cpu-req
        resourceFieldRef: {containerName: main, resource: requests.cpu, divisor: 1m}
      - {path: cpu-limit, resourceFieldRef: {containerName: main, resource: limits.cpu}}
  - name: kube-api-access
    projected:
      sources:
      - serviceAccountToken: {path: token, expirationSeconds: 3607}
      - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
  - name: cert
    projected:
      sources:
      - podCertificate:
          signerName: example.com/pods
          keyType: ED25519
          credentialBundlePath: bundle.pem
          keyPath: key.pem
          certificateChainPath: chain.pem
"""


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("objvol")
    service = ServeProcess(
        tmp / "svc",
        args=["--token-max-ttl", str(TOKEN_TTL), "--node-allocatable", "cpu=3,memory=1Gi"],
    )
    service.workdir.mkdir()
    try:
        service.start()
        yield service
    finally:
        service.kill()
        unmount_under(tmp)


def apply(svc: ServeProcess, text: str) -> str:
    code, out, err = cli(svc, "apply", "-f", "-", stdin=text)
    assert code == 0, out + err
    return out


def vol_dir(svc: ServeProcess, uid: str, plugin: str, name: str) -> Path:
    return svc.root_dir / "pods" / uid / "volumes" / f"kubernetes.io~{plugin}" / name


def events(svc: ServeProcess) -> list[Any]:
    with svc.open_log() as log:
        return [env.body for env in log.read_after(0)]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def ts_dirs(path: Path) -> list[str]:
    return [n for n in os.listdir(path) if TS_DIR_RE.match(n)]


@pytest.fixture(scope="module")
def uid(svc: ServeProcess) -> str:
    """The pod applied from a plain manifest with no uid, mounted."""
    apply(svc, OBJECTS)
    out = apply(svc, POD)
    found = UID_LINE.search(out)
    assert found, out
    code, out, err = cli(svc, "wait", "pod", "default/web", "--for", "mounted", "--timeout", "60")
    assert code == 0, out + err
    return found[2]


def test_configmap_volume_layout_content_and_modes(svc: ServeProcess, uid: str) -> None:
    root = vol_dir(svc, uid, "configmap", "config")
    assert mounts.find_mount(root) is None  # configMap: the node's disk, like the kubelet
    [ts] = ts_dirs(root)
    assert os.readlink(root / DATA_DIR) == ts
    assert sorted(os.listdir(root)) == sorted([DATA_DIR, ts, "app.properties", "mode", "blob.bin"])
    assert read_payload(root) == {
        "app.properties": b"color=blue\n",
        "mode": b"fast",
        "blob.bin": bytes(range(8)),
    }
    assert {mode(root / n) for n in ("app.properties", "mode", "blob.bin")} == {0o644}
    items = vol_dir(svc, uid, "configmap", "config-items")
    assert read_payload(items) == {"deep/dir/mode.txt": b"fast", "props": b"color=blue\n"}
    assert os.readlink(items / "deep") == "..data/deep"
    assert (mode(items / "deep/dir/mode.txt"), mode(items / "props")) == (0o640, 0o600)
    assert read_payload(vol_dir(svc, uid, "configmap", "maybe")) == {}


def test_secret_is_on_tmpfs_with_its_mode(svc: ServeProcess, uid: str) -> None:
    creds = vol_dir(svc, uid, "secret", "creds")
    found = mounts.find_mount(creds)
    assert found is not None and found.fstype == "tmpfs"
    # sized as the kubelet's wrapped memory emptyDir: the pod's 64Mi limit, below allocatable 1Gi
    assert found.super_option("size") == f"{64 * 1024}k"
    assert (creds / "password").read_bytes() == SECRET.encode()
    assert mode(creds / "password") == 0o400


def test_downward_api_files(svc: ServeProcess, uid: str) -> None:
    info = vol_dir(svc, uid, "downward-api", "podinfo")
    found = mounts.find_mount(info)
    assert found is not None and found.fstype == "tmpfs"
    assert read_payload(info) == {
        "labels": b'app="web"\ntier="front"',
        "tier": b"front",
        "annotations": b'note="say \\"hi\\""',
        "uid": uid.encode(),
        "mem": b"64",
        "cpu-req": b"250",
        "cpu-limit": b"3",  # unset limit: the node's allocatable (--node-allocatable)
    }


def _token(svc: ServeProcess, uid: str) -> dict[str, Any]:
    text = (vol_dir(svc, uid, "projected", "kube-api-access") / "token").read_text()
    claims: dict[str, Any] = jwt.decode(text, options={"verify_signature": False})
    return claims


def test_projected_token_is_a_bound_jwt_and_is_refreshed(svc: ServeProcess, uid: str) -> None:
    proj = vol_dir(svc, uid, "projected", "kube-api-access")
    assert read_payload(proj).keys() == {"token", "ca.crt", "namespace"}
    assert (proj / "namespace").read_bytes() == b"default"
    claims = _token(svc, uid)
    assert claims["sub"] == "system:serviceaccount:default:builder"
    assert claims["kubernetes.io"]["pod"] == {"name": "web", "uid": uid}
    assert claims["exp"] - claims["iat"] == TOKEN_TTL
    refreshed = until("a refreshed token", lambda: _token(svc, uid)["jti"] != claims["jti"], 20)
    assert refreshed

    def token_writes() -> list[VolumeMounted]:
        return [
            b
            for b in events(svc)
            if isinstance(b, VolumeMounted) and b.volume_name == "kube-api-access"
        ]

    written = until(
        "the refresh in the log",
        lambda: [b for b in token_writes() if b.contents.startswith("written: token ")][1:],
    )
    assert written and all(" token default/builder issued=" in b.contents for b in token_writes())
    _, page = svc.http_get("/metrics")
    assert re.search(
        r'volfsm_volume_content_writes_total\{plugin="kubernetes.io/projected",result="written"\} '
        r"([2-9]|\d\d)",
        page,
    )


def test_pod_certificate_bundle(svc: ServeProcess, uid: str) -> None:
    files = read_payload(vol_dir(svc, uid, "projected", "cert"))
    assert files.keys() == {"bundle.pem", "key.pem", "chain.pem"}
    assert files["bundle.pem"] == files["key.pem"] + files["chain.pem"]
    assert files["key.pem"].startswith(b"-----BEGIN PRIVATE KEY-----")
    assert files["chain.pem"].count(b"-----BEGIN CERTIFICATE-----") == 2
    assert files["key.pem"] not in (svc.data_dir / "volfsm.db").read_bytes()


def test_missing_object_and_key_make_the_pod_wait_with_the_reason(svc: ServeProcess) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "waiting", "uid": "uid-waiting"},
        "spec": {
            "volumes": [
                {"name": "gone", "configMap": {"name": "nope"}},
                {
                    "name": "key",
                    "secret": {"secretName": "app-secret", "items": [{"key": "x", "path": "x"}]},
                },
                {
                    "name": "skip",
                    "secret": {
                        "secretName": "app-secret",
                        "optional": True,
                        "items": [{"key": "x", "path": "x"}],
                    },
                },
            ]
        },
    }
    apply(svc, yaml.safe_dump(pod))

    def failures() -> set[str]:
        bodies = events(svc)
        ops = {
            b.op_id
            for b in bodies
            if isinstance(b, OperationStarted) and b.pod_uid == "uid-waiting"
        }
        return {b.message for b in bodies if isinstance(b, OperationFailed) and b.op_id in ops}

    seen = until(
        "both volumes failing",
        lambda: (
            (f := failures())
            and any("not found" in m for m in f)
            and any("key: x" in m for m in f)
            and f
        ),
    )
    assert any('configmaps "nope" not found' in m for m in seen)
    assert any("references non-existent secret key: x" in m for m in seen)
    code, out, err = cli(svc, "explain", "pod", "default/waiting")
    assert code == 0, err
    assert 'configmaps "nope" not found' in out
    skip = vol_dir(svc, "uid-waiting", "secret", "skip")
    until("the optional volume mounted empty", lambda: (skip / DATA_DIR).is_symlink())
    assert read_payload(skip) == {}
    apply(svc, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: nope}\ndata: {k: v}\n")
    gone = vol_dir(svc, "uid-waiting", "configmap", "gone")
    until("the late ConfigMap mounted", lambda: (gone / DATA_DIR).is_symlink())
    assert (gone / "k").read_bytes() == b"v"


@pytest.mark.parametrize("path", ["../escape", "/abs", "a/../../escape", "..data"])
def test_item_paths_escaping_the_volume_are_refused(svc: ServeProcess, path: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "esc", "uid": "uid-esc"},
        "spec": {
            "volumes": [
                {
                    "name": "c",
                    "configMap": {"name": "app-config", "items": [{"key": "mode", "path": path}]},
                }
            ]
        },
    }
    code, out, err = cli(svc, "apply", "-f", "-", stdin=yaml.safe_dump(pod))
    assert code != 0
    assert "path" in (out + err).lower()
    assert not (svc.root_dir / "pods" / "uid-esc").exists()


def test_configmap_change_reaches_the_pod_atomically(svc: ServeProcess, uid: str) -> None:
    root = vol_dir(svc, uid, "configmap", "config")
    stop = threading.Event()
    bad: list[str] = []
    reads = [0]
    old = {"app.properties": b"color=blue\n", "mode": b"fast", "blob.bin": bytes(range(8))}
    new = {"app.properties": b"color=green\n" * 500, "mode": b"slow", "blob.bin": bytes(range(8))}

    def reader() -> None:
        while not stop.is_set():
            try:
                data = (root / "app.properties").read_bytes()
            except FileNotFoundError:
                continue
            if data not in (old["app.properties"], new["app.properties"]):
                bad.append(f"partial: {len(data)} bytes")
            if read_payload(root) not in (old, new):
                bad.append("a mixed set")
            reads[0] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        apply(
            svc,
            OBJECTS.replace('"color=blue\\n"', '"' + "color=green\\n" * 500 + '"').replace(
                "mode: fast", "mode: slow"
            ),
        )
        until("the new ConfigMap in the pod", lambda: (root / "mode").read_bytes() == b"slow", 10)
    finally:
        stop.set()
        thread.join()
    assert bad == [] and reads[0] > 0
    assert read_payload(root) == new
    until("the old payload dir removed (by the reaper)", lambda: len(ts_dirs(root)) == 1, 10)

    def mounts() -> list[VolumeMounted]:
        bodies = events(svc)
        return [b for b in bodies if isinstance(b, VolumeMounted) and b.volume_name == "config"]

    # The files swap before the rewrite's VolumeMounted is durable: wait for the record.
    until("the rewrite recorded", lambda: mounts()[-1].contents != mounts()[0].contents, 10)
    mounted = mounts()
    assert "ConfigMap default/app-config" in mounted[-1].contents
    assert mounted[-1].contents != mounted[0].contents  # a new resource version
    code, out, err = cli(svc, "replay")  # which version the pod had mounted when
    assert code == 0, err
    told = " ".join(out.split())
    assert f"files {mounted[0].contents}" in told and f"files {mounted[-1].contents}" in told


def test_no_secret_value_outside_the_store_and_the_tmpfs(svc: ServeProcess, uid: str) -> None:
    needles = [SECRET.encode(), base64.b64encode(SECRET.encode())]
    store = svc.data_dir / "objects"
    for path in svc.data_dir.rglob("*"):
        if path.is_file() and store not in path.parents:
            assert not any(n in path.read_bytes() for n in needles), path
    assert not any(n in svc.stderr_path.read_bytes() for n in needles)
    contents = [b.contents for b in events(svc) if isinstance(b, VolumeMounted)]
    assert contents and not any(SECRET in c for c in contents)
    token = (vol_dir(svc, uid, "projected", "kube-api-access") / "token").read_bytes()
    assert token not in (svc.data_dir / "volfsm.db").read_bytes()


def test_restart_and_sigkill_mid_update_converge(svc: ServeProcess, uid: str) -> None:
    root = vol_dir(svc, uid, "configmap", "config")
    for round_, sig in enumerate((signal.SIGTERM, signal.SIGKILL)):
        value = f"v{round_}"
        apply(svc, OBJECTS.replace("mode: fast", f"mode: {value}"))
        assert svc.stop(sig) in (0, -signal.SIGKILL)
        svc.start()
        until(
            f"{value} after the restart", lambda v=value: (root / "mode").read_bytes() == v.encode()
        )
        until("no leftover timestamped dir", lambda: len(ts_dirs(root)) == 1)
        creds = vol_dir(svc, uid, "secret", "creds")
        assert (creds / "password").read_bytes() == SECRET.encode()
    code, out, err = cli(svc, "get", "configmaps", "-o", "json")
    assert code == 0 and "app-config" in out, err
    assert json.loads(out)["items"]
