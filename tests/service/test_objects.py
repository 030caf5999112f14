"""The node's objects end to end: a real `volfsm serve` and volfsm's CSI driver, the CLI.

One driver and one service for the module; the tests run in order as the
steps of one story: a documentation manifest applied (other kinds skipped,
exit 3), `get` of every kind, a pod's every problem at once, restarts
(SIGTERM and SIGKILL) keeping every object, and a Secret's value found
nowhere but in the object store.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.errors import NotFoundError

from events.types import ObjectApplied, ObjectDeleted
from tests.helpers.csidriver import DriverProcess, cleanup_under
from tests.service.helpers import ServeProcess, cli, unmount_under

SECRET = "Zq8-very-secret-value-7Rk"
PEM_BODY = base64.b64encode(b"a certificate would be DER here").decode()
MANIFEST = f"""\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: nginx-deployment
spec:
  replicas: 3
  selector: {{matchLabels: {{app: nginx}}}}
  template:
    metadata: {{labels: {{app: nginx}}}}
    spec:
      containers: [{{name: nginx, image: "nginx:1.14.2"}}]
---
apiVersion: v1
kind: Service
metadata:
  name: my-service
spec:
  selector: {{app: nginx}}
  ports: [{{protocol: TCP, port: 80, targetPort: 9376}}]
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: game-demo
data:
  player_initial_lives: "3"
  enabled: yes
  game.properties: |
    enemy.types=aliens,monsters
---
apiVersion: v1
kind: Secret
metadata:
  name: db-credentials
  namespace: shop
type: kubernetes.io/basic-auth
stringData:
  username: admin
  password: {SECRET}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: build-robot
automountServiceAccountToken: false
---
apiVersion: certificates.k8s.io/v1beta1
kind: ClusterTrustBundle
metadata:
  name: example.com:ca:root
  labels: {{tier: gold}}
spec:
  signerName: example.com/ca
  trustBundle: |
    -----BEGIN CERTIFICATE-----
    {PEM_BODY}
    -----END CERTIFICATE-----
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: csi.volfsm.dev
spec:
  attachRequired: false
  podInfoOnMount: true
  fsGroupPolicy: File
  tokenRequests: [{{audience: vault, expirationSeconds: 3600}}]
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: objects-pv
spec:
  capacity: {{storage: 16Mi}}
  accessModes: [ReadWriteOnce]
  csi: {{driver: csi.volfsm.dev, volumeHandle: objects-vol}}
  claimRef: {{namespace: default, name: objects-claim}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: objects-claim
spec:
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 16Mi}}}}
  volumeName: objects-pv
---
apiVersion: v1
kind: Pod
metadata:
  name: test-pd
spec:
  containers:
  - image: registry.k8s.io/test-webserver
    name: test-container
    volumeMounts: [{{mountPath: /cache, name: cache-volume}}]
  volumes:
  - name: cache-volume
    emptyDir: {{sizeLimit: 8Mi}}
"""
KINDS_LISTED = {
    # kube-root-ca.crt: published by volfsm for test-pd's token volume (as the cluster's
    # root-ca-cert-publisher would)
    "configmaps": ("game-demo", "kube-root-ca.crt"),
    "secrets": ("db-credentials",),
    "serviceaccounts": ("build-robot",),
    "clustertrustbundles": ("example.com:ca:root",),
    "csidrivers": ("csi.volfsm.dev",),
    "pvs": ("objects-pv",),
    "pvcs": ("objects-claim",),
}
PUBLISHED = (
    "configmap/default/kube-root-ca.crt created (published by volfsm from the node-local CA)"
)
UID_LINE = re.compile(r"^pod/default/test-pd (created|unchanged) \(uid ([0-9a-f-]{36})\)$", re.M)


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A service with volfsm's CSI driver registered (its PVs may be applied)."""
    tmp = tmp_path_factory.mktemp("objects")
    drv = DriverProcess(tmp / "driver", node_id="n1")
    drv.workdir.mkdir()
    service = ServeProcess(tmp / "svc", args=["--csi", f"csi.volfsm.dev={drv.endpoint}"])
    service.workdir.mkdir()
    try:
        drv.start()
        service.start()
        yield service
    finally:
        service.kill()
        unmount_under(tmp)
        drv.close()
        cleanup_under(tmp)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("manifests") / "docs.yaml"
    path.write_text(MANIFEST)
    return path


def listed(svc: ServeProcess, what: str) -> list[dict[str, object]]:
    code, out, err = cli(svc, "get", what, "-o", "json")
    assert code == 0, err
    items: list[dict[str, object]] = json.loads(out)["items"]
    return items


def game_demo(svc: ServeProcess) -> dict[str, object]:
    [found] = [item for item in listed(svc, "configmaps") if item["name"] == "game-demo"]
    return found


def restart(svc: ServeProcess, sig: int) -> None:
    """Stop the service with `sig`, wait for its embedded NATS to go, start it again."""
    assert svc.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    store = str(svc.data_dir / "nats").encode()
    deadline = time.monotonic() + 30
    while any(store in p.read_bytes() for p in Path("/proc").glob("[0-9]*/cmdline") if p.exists()):
        assert time.monotonic() < deadline, "the embedded nats-server outlived its service"
        time.sleep(0.05)
    svc.start()


def test_a_documentation_manifest_is_applied_and_other_kinds_are_skipped(
    svc: ServeProcess, manifest: Path
) -> None:
    code, out, err = cli(svc, "apply", "-f", str(manifest))
    assert code == 3, err
    assert err.splitlines() == [
        "deployment.apps/nginx-deployment skipped: a node does not run Deployment objects "
        "(apps/v1)",
        "service/my-service skipped: a node does not run Service objects (v1)",
    ]
    lines = out.splitlines()
    assert lines[:-3] == [
        "configmap/default/game-demo created",
        "secret/shop/db-credentials created",
        "serviceaccount/default/build-robot created",
        "clustertrustbundle/example.com:ca:root created",
        "csidriver/csi.volfsm.dev created",
        "persistentvolume/objects-pv created",
        "persistentvolumeclaim/default/objects-claim created",
    ]
    first = UID_LINE.fullmatch(lines[-3])
    assert first is not None and first[1] == "created"
    assert lines[-2].startswith("pod/default/test-pd: added volume kube-api-access-")
    assert lines[-1] == PUBLISHED
    code, _, err = cli(svc, "wait", "pod", "default/test-pd", "--for", "mounted", "--timeout", "30")
    assert code == 0, err
    code, out, _ = cli(svc, "apply", "-f", "-", stdin=MANIFEST)  # the same, from stdin
    again = UID_LINE.search(out)
    assert code == 3 and again is not None and again.groups() == ("unchanged", first[2])


def test_every_problem_of_a_pod_is_reported_at_once_and_nothing_applied(
    svc: ServeProcess, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: would-be-applied}\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata: {name: broken}\nspec:\n  volumes:\n"
        "  - {name: a, persistentVolumeClaim: {claimName: nope}}\n"
        "  - {name: b, configMap: {name: app, defaultMode: 01000}}\n"
        "  - {name: c, nfs: {server: nfs.example.com, path: /export}}\n"
        "  - {name: d, emptyDir: {sizeLimit: lots}}\n"
    )
    code, _, err = cli(svc, "apply", "-f", str(bad))
    assert code == 1
    prefix = "volfsm: error: node n1: InvalidObject: "
    assert err.startswith(prefix)
    lines = err.removeprefix(prefix).splitlines()
    assert all(line.startswith("Pod default/broken: ") for line in lines)
    assert [line.split(": ")[1] for line in lines] == [  # a missing claim is waited for
        "spec.volumes[1].configMap.defaultMode",
        "spec.volumes[3].emptyDir.sizeLimit",
        "spec.volumes",
    ]
    assert lines[-1].endswith("no volume plugin on this node serves c (nfs)")
    assert "would-be-applied" not in {item["name"] for item in listed(svc, "configmaps")}


def test_get_lists_every_kind_and_never_a_secret_value(svc: ServeProcess) -> None:
    for what, names in KINDS_LISTED.items():
        assert tuple(item["name"] for item in listed(svc, what)) == names, what
        code, out, err = cli(svc, "get", what)
        assert code == 0 and all(name in out for name in names), err
    [secret] = listed(svc, "secrets")
    assert secret["summary"] == {
        "type": "kubernetes.io/basic-auth",
        "keys": {"password": len(SECRET), "username": 5},
        "immutable": False,
    }
    assert "object" not in secret and str(secret["content_hash"]).startswith("hmac-sha256:")
    code, out, _ = cli(svc, "get", "secrets")
    assert "password (25 B)" in out and SECRET not in out
    [driver] = listed(svc, "csidrivers")
    assert driver["summary"] == {
        "attach_required": False,
        "pod_info_on_mount": True,
        "fs_group_policy": "File",
        "requires_republish": False,
        "token_audiences": ["vault"],
        "volume_lifecycle_modes": ["Persistent"],
        "storage_capacity": False,
        "se_linux_mount": False,
    }
    cm = game_demo(svc)
    assert cm["object"]["data"]["enabled"] == "yes"  # type: ignore[index]


def test_objects_survive_a_restart_and_a_sigkill(svc: ServeProcess, manifest: Path) -> None:
    before = game_demo(svc)
    restart(svc, signal.SIGTERM)
    for what, names in KINDS_LISTED.items():
        assert tuple(item["name"] for item in listed(svc, what)) == names, what
    changed = MANIFEST.replace('player_initial_lives: "3"', 'player_initial_lives: "5"')
    code, out, _ = cli(svc, "apply", "-f", "-", stdin=changed)
    assert code == 3 and "configmap/default/game-demo configured" in out
    after = game_demo(svc)
    assert int(str(after["resource_version"])) > int(str(before["resource_version"]))
    assert after["uid"] == before["uid"] and after["content_hash"] != before["content_hash"]

    restart(svc, signal.SIGKILL)
    kept = game_demo(svc)
    assert kept["resource_version"] == after["resource_version"]
    assert kept["object"]["data"]["player_initial_lives"] == "5"  # type: ignore[index]
    assert [item["name"] for item in listed(svc, "pvcs")] == ["objects-claim"]
    code, out, _ = cli(svc, "apply", "-f", str(manifest))  # the pod keeps its uid
    assert code == 3 and UID_LINE.search(out) is not None

    user = (  # the claim and its PV were applied before the restarts: they are remembered
        "apiVersion: v1\nkind: Pod\nmetadata: {name: claim-user}\nspec:\n  volumes:\n"
        "  - {name: data, persistentVolumeClaim: {claimName: objects-claim}}\n"
    )
    code, out, err = cli(svc, "apply", "-f", "-", stdin=user)
    assert code == 0 and out.startswith("pod/default/claim-user created (uid "), err
    code, _, err = cli(svc, "delete", "pvc", "objects-claim")
    assert code == 1
    assert err == (
        "volfsm: error: node n1: InvalidObject: PersistentVolumeClaim default/objects-claim: "
        "in use by pod default/claim-user; delete the pod first\n"
    )
    assert cli(svc, "delete", "pod", "default/claim-user")[0] == 0
    code, _, err = cli(svc, "delete", "pvc", "objects-claim")
    assert code == 0, err
    code, out, err = cli(svc, "delete", "configmap", "game-demo")
    assert code == 0 and out == "configmap/default/game-demo deleted\n", err
    assert [item["name"] for item in listed(svc, "configmaps")] == ["kube-root-ca.crt"]
    code, _, err = cli(svc, "delete", "configmap", "game-demo")
    assert code == 1 and "NotFound: ConfigMap default/game-demo is not stored" in err
    code, out, _ = cli(svc, "explain", "object", "configmap", "game-demo")
    assert code == 0
    assert out.splitlines()[1] == "current: none (deleted)"
    history = [line.split()[3] for line in out.splitlines()[3:]]
    assert history == ["created", "configured", "configured", "deleted"]  # 3 -> 5 -> 3 again
    with svc.open_log() as log:
        types = [(e.type, getattr(e.body, "kind", "")) for e in log.read_after(0)]
    assert ("ObjectDeleted", "ConfigMap") in types
    assert ("ObjectDeleted", "PersistentVolumeClaim") in types


async def stream_messages(url: str) -> list[bytes]:
    """Every message of every JetStream stream on the server: data and headers."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        found: list[bytes] = []
        for info in await js.streams_info():
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    msg = await js.get_msg(info.config.name, seq)
                except NotFoundError:
                    continue
                found.append((msg.data or b"") + json.dumps(msg.headers or {}).encode())
        return found
    finally:
        await nc.close()


def test_a_secret_value_is_nowhere_but_in_the_object_store(svc: ServeProcess) -> None:
    needles = [SECRET.encode(), base64.b64encode(SECRET.encode())]
    store = svc.data_dir / "objects"
    in_store = b"".join(p.read_bytes() for p in store.iterdir())
    assert needles[1] in in_store  # the control: the value was applied, and kept there
    outside = [p for p in svc.data_dir.rglob("*") if p.is_file() and store not in p.parents]
    assert {p.name for p in outside} >= {"volfsm.db", "volfsm.db-wal"}
    for path in outside:  # the log, its WAL, the JetStream store, everything else
        data = path.read_bytes()
        assert not any(n in data for n in needles), path
    messages = asyncio.run(stream_messages(svc.url))
    assert any(b"ObjectApplied" in m and b"db-credentials" in m for m in messages)
    assert not any(n in m for m in messages for n in needles)
    logged = svc.stderr_path.read_bytes()
    assert b"taking commands" in logged and not any(n in logged for n in needles)
    with svc.open_log() as log:
        secrets = [
            e.body
            for e in log.read_after(0)
            if isinstance(e.body, ObjectApplied | ObjectDeleted) and e.body.kind == "Secret"
        ]
    assert [type(b).__name__ for b in secrets] == ["ObjectApplied"]
    assert isinstance(secrets[0], ObjectApplied) and secrets[0].keys == ("password", "username")
