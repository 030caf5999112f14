"""A corpus of Pod manifests shaped like the ones people write, applied unedited through one
real `volfsm serve` (with its embedded nats-server) and checked against what the kubelet
would put on the node.

`tests/data/realworld/` holds the files: ConfigMap, Secret, downwardAPI and projected
volumes (the kube-api-access-* shape the API server injects included), emptyDir on disk and
in memory, hostPath of each creating type, PV + PVC + pod files (hostPath and local PVs),
fsGroup, subPath, init containers and sidecars, a Deployment + Service + ConfigMap file,
`kind: List`, JSON, CRLF line ends and the YAML quirks kubectl takes. Each file is applied
once with `volfsm apply -f FILE`, in name order; `EXPECT` says what each apply must answer.
Then every pod's volumes are checked (files, the atomic writer's symlinks, modes, tmpfs and
its size, tokens, host paths made with their type, fsGroup ownership), and at the end every
pod is deleted and the host paths must hold exactly what they held while mounted.

The pods are admitted as the API server's ServiceAccount admission plugin admits them: each
gets the kube-api-access-* token volume where the API server would add it (not the dumps of
files 08 and 13, which carry theirs), and each namespace a kube-root-ca.crt ConfigMap.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import pytest

from tests.service.helpers import REPO_ROOT, ServeProcess, cli, unmount_under, until
from volfsm.desired.admission import api_access_name
from volfsm.node import mounts
from volfsm.node.atomicwriter import DATA_DIR, TS_DIR_RE

CORPUS = REPO_ROOT / "tests" / "data" / "realworld"
HOST = Path("/tmp/volfsm-realworld-corpus")
"""The host paths the corpus' hostPath and local volumes name (absolute, as in a manifest)."""
ALLOCATABLE = "cpu=2,memory=1Gi"
GIB_K = f"{1024 * 1024}k"
CREATED = re.compile(r"^pod/(\S+)/(\S+) created \(uid ([0-9a-f-]{36})\)", re.M)


@dataclass(frozen=True)
class Expect:
    """What applying one file must answer."""

    code: int = 0
    pods: tuple[str, ...] = ()
    """NAMESPACE/NAME of each pod the file creates."""
    stderr: tuple[str, ...] = ()
    """The exact lines on stderr."""
    pending: tuple[str, ...] = ()
    """Pods accepted but waiting (not mounted)."""


def _skip(what: str, kind: str, api: str) -> str:
    return f"{what} skipped: a node does not run {kind} objects ({api})"


EXPECT: dict[str, Expect] = {
    "01-configmap-volume.yaml": Expect(pods=("default/bakery",)),
    "02-configmap-items-defaultmode.yaml": Expect(pods=("default/proxy",)),
    "03-secret-volume.yaml": Expect(pods=("default/ledger",)),
    "04-secret-optional.yaml": Expect(pods=("default/mailer",)),
    "05-downward-labels-annotations.yaml": Expect(pods=("default/labelled",)),
    "06-downward-resources.yaml": Expect(pods=("default/sized",)),
    "07-projected-sources.yaml": Expect(pods=("default/vault-client",)),
    "08-kube-api-access-dump.yaml": Expect(pods=("default/api-7d9c5b6f4-x2kqp",)),
    "09-emptydir-memory.yaml": Expect(pods=("default/cache",)),
    "10-hostpath-types.yaml": Expect(pods=("default/log-shipper",)),
    "11-pv-pvc-hostpath.yaml": Expect(pods=("default/notes",)),
    "12-local-pv-node-affinity.yaml": Expect(
        code=3,
        pods=("default/indexer",),
        stderr=(
            _skip("storageclass.storage.k8s.io/local-disks", "StorageClass", "storage.k8s.io/v1"),
        ),
    ),
    "13-fsgroup-emptydir.yaml": Expect(pods=("default/ownership-demo",)),
    "14-subpath.yaml": Expect(pods=("default/site",)),
    "15-init-and-sidecar.yaml": Expect(pods=("default/report-builder",)),
    "16-deployment-service-configmap.yaml": Expect(
        code=3,
        stderr=(
            _skip("deployment.apps/frontend", "Deployment", "apps/v1"),
            _skip("service/frontend", "Service", "v1"),
        ),
    ),
    "17-yaml-quirks.yaml": Expect(pods=("default/quirks",)),
    "18-kind-list.yaml": Expect(pods=("default/greeter",)),
    "19-pod.json": Expect(pods=("default/json-pod",)),
    "20-pvc-dynamic-unbound.yaml": Expect(
        pods=("default/uploader",), pending=("default/uploader",)
    ),
    "21-namespace-tls-secret.yaml": Expect(
        code=3,
        pods=("payments/checkout",),
        stderr=(_skip("namespace/payments", "Namespace", "v1"),),
    ),
    "22-unsupported-nfs.yaml": Expect(
        code=1,
        stderr=(
            "volfsm: error: node n1: InvalidObject: Pod default/archive-reader: spec.volumes: "
            "no volume plugin on this node serves archive (nfs)",
        ),
    ),
    "23-crlf-line-ends.yaml": Expect(pods=("default/dos-lines",)),
    "24-immutable-and-registry-secret.yaml": Expect(pods=("default/release-checker",)),
    "25-duplicate-key.yaml": Expect(
        code=2,
        stderr=(
            f"volfsm: error: {CORPUS / '25-duplicate-key.yaml'}: document 0: invalid YAML at "
            'line 17, column 3: mapping key "volumes" already defined at line 8',
        ),
    ),
    "26-hugepages.yaml": Expect(
        code=1,
        stderr=(
            "volfsm: error: node n1: InvalidObject: Pod default/dpdk-worker: "
            "spec.volumes[0].emptyDir: emptyDir medium 'HugePages' is not served on this node: "
            "volfsm mounts no hugetlbfs and reserves no huge pages (use '' or 'Memory')",
        ),
    ),
    "27-generic-ephemeral.yaml": Expect(
        pods=("default/batch-scratch",), pending=("default/batch-scratch",)
    ),
    "28-static-pv-unbound-claim.yaml": Expect(pods=("default/shelf",), pending=("default/shelf",)),
}


@dataclass
class Applied:
    """What applying the corpus did: per file (exit code, stdout, stderr), each pod's uid."""

    svc: ServeProcess
    results: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)
    host_mounted: dict[str, tuple[bytes | None, int, int, int]] = field(default_factory=dict)

    def vol(self, pod: str, plugin: str, name: str) -> Path:
        """A pod volume's dir, as the kubelet names it."""
        uid = self.uids[pod]
        return self.svc.root_dir / "pods" / uid / "volumes" / f"kubernetes.io~{plugin}" / name


def _seed_host() -> None:
    """The host data the hostPath and local volumes of the corpus find."""
    if HOST.exists():
        unmount_under(HOST)
        shutil.rmtree(HOST)
    for path, text in {
        "applogs/app-2024-03-11.log": "GET /healthz 200\n",
        "notes/welcome.txt": "first note\n",
        "fast-disk-0/segment-0001.idx": "index segment\n",
        "fast-disk-0/shards/a.bin": "shard a\n",
    }.items():
        (HOST / path).parent.mkdir(parents=True, exist_ok=True)
        (HOST / path).write_text(text)


def _host_tree() -> dict[str, tuple[bytes | None, int, int, int]]:
    """Every entry under HOST: (content of a file, mode, uid, gid)."""
    tree = {}
    for dirpath, dirs, files in os.walk(HOST):
        for name in [*dirs, *files]:
            path = Path(dirpath) / name
            st = path.lstat()
            content = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
            tree[str(path.relative_to(HOST))] = (content, st.st_mode, st.st_uid, st.st_gid)
    return tree


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Applied]:
    """One service; every corpus file applied once, in name order; the pods mounted."""
    tmp = tmp_path_factory.mktemp("realworld")
    _seed_host()
    svc = ServeProcess(tmp / "svc", args=["--node-allocatable", ALLOCATABLE])
    svc.workdir.mkdir()
    try:
        svc.start()
        done = Applied(svc)
        for path in sorted(CORPUS.iterdir()):
            code, out, err = cli(svc, "apply", "-f", str(path))
            done.results[path.name] = (code, out, err)
            done.uids.update({f"{ns}/{name}": uid for ns, name, uid in CREATED.findall(out)})
        for expect in EXPECT.values():
            for pod in set(expect.pods) - set(expect.pending):
                if pod in done.uids:
                    cli(svc, "wait", "pod", pod, "--for", "mounted", "--timeout", "30")
        done.host_mounted = _host_tree()
        yield done
    finally:
        svc.kill()
        unmount_under(tmp)
        unmount_under(HOST)
        shutil.rmtree(HOST, ignore_errors=True)


def test_every_corpus_file_has_its_expectation() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(EXPECT)
    assert len(EXPECT) >= 20


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_apply_answers_as_expected(applied: Applied, name: str) -> None:
    expect = EXPECT[name]
    code, out, err = applied.results[name]
    assert (code, err.splitlines()) == (expect.code, list(expect.stderr)), out + err
    created = {f"{ns}/{pod}" for ns, pod, _ in CREATED.findall(out)}
    assert created == set(expect.pods), out


# ------------------------------------------------------------------ what a volume holds


@dataclass(frozen=True)
class File:
    """One file of an atomic-writer volume."""

    content: bytes
    mode: int
    uid: int = 0
    gid: int = 0


def payload(vol: Path) -> dict[str, File]:
    """The files of an atomic-writer volume, after checking the kubelet's layout: `..data`
    a relative symlink to the one timestamped dir, one `<top> -> ..data/<top>` symlink per
    first path segment, nothing else."""
    ts_dir = os.readlink(vol / DATA_DIR)
    assert TS_DIR_RE.match(ts_dir), ts_dir
    files: dict[str, File] = {}
    for dirpath, _, names in os.walk(vol / ts_dir):
        for name in names:
            path = Path(dirpath) / name
            st = path.lstat()
            assert stat.S_ISREG(st.st_mode), path
            rel = str(path.relative_to(vol / ts_dir))
            files[rel] = File(path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    tops = {rel.split("/")[0] for rel in files}
    assert set(os.listdir(vol)) == {DATA_DIR, ts_dir, *tops}
    for top in tops:
        assert os.readlink(vol / top) == f"{DATA_DIR}/{top}"
    assert mode(vol / ts_dir) & 0o777 == 0o755  # plus setgid after an fsGroup pass
    return files


def contents(vol: Path) -> dict[str, tuple[bytes, int]]:
    """(content, mode) of each file of an atomic-writer volume."""
    return {rel: (f.content, f.mode) for rel, f in payload(vol).items()}


def tmpfs_size(vol: Path) -> str | None:
    """The `size=` of the tmpfs mounted at `vol`; None when it is no mount (the node's disk)."""
    found = mounts.find_mount(vol)
    if found is None:
        return None
    assert found.fstype == "tmpfs", found
    return found.super_option("size")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def token_claims(path: Path) -> dict[str, Any]:
    claims: dict[str, Any] = jwt.decode(path.read_text(), options={"verify_signature": False})
    return claims


def host_record(vol: Path) -> dict[str, Any]:
    """What the hostPath plugin recorded for a volume (the host path is not mounted)."""
    assert mounts.find_mount(vol) is None
    record: dict[str, Any] = json.loads((vol / "host-path.json").read_text())
    return record


def node_pods(a: Applied) -> set[str]:
    """NAMESPACE/NAME of every pod the node has."""
    code, out, err = cli(a.svc, "get", "pods", "-o", "json")
    assert code == 0, out + err
    return {f"{p['namespace']}/{p['name']}" for p in json.loads(out)["items"]}


Check = Callable[[Applied], None]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn

    return register


@check("01-configmap-volume.yaml")
def _configmap_every_key(a: Applied) -> None:
    vol = a.vol("default/bakery", "configmap", "settings")
    assert tmpfs_size(vol) is None and mode(vol) == 0o777
    assert contents(vol) == {
        "oven_count": (b"3", 0o644),
        "opening_hour": (b"7", 0o644),
        "bakery.properties": (
            b"bread.kinds=rye,spelt,sourdough\nbread.daily=120\npastry.enabled=true\n",
            0o644,
        ),
    }


@check("02-configmap-items-defaultmode.yaml")
def _configmap_items(a: Applied) -> None:
    vol = a.vol("default/proxy", "configmap", "conf")
    assert contents(vol) == {
        "routes/upstreams.list": (b"backend-a:8080\nbackend-b:8080\n", 0o440),
        "timeouts.conf": (b"connect=2s read=30s", 0o600),
    }


@check("03-secret-volume.yaml")
def _secret_items_modes(a: Applied) -> None:
    vol = a.vol("default/ledger", "secret", "db-creds")
    assert tmpfs_size(vol) == GIB_K  # no memory limit: the node's allocatable
    assert contents(vol) == {
        "auth/password": (b"s3cr3t-ledger-pw", 0o400),
        "auth/user": (b"ledger", 0o400),  # defaultMode: 256
    }


@check("04-secret-optional.yaml")
def _secret_optional(a: Applied) -> None:
    smtp = a.vol("default/mailer", "secret", "smtp")
    assert contents(smtp) == {"host": (b"smtp.example.net", 0o644), "port": (b"587", 0o644)}
    dkim = a.vol("default/mailer", "secret", "dkim")
    assert tmpfs_size(dkim) == GIB_K and contents(dkim) == {}


@check("05-downward-labels-annotations.yaml")
def _downward_metadata(a: Applied) -> None:
    vol = a.vol("default/labelled", "downward-api", "podinfo")
    assert tmpfs_size(vol) == GIB_K
    assert contents(vol) == {
        "labels": (b'cluster="blue"\nrelease="2024.1"\nzone="north"', 0o644),
        "annotations": (b'owner="ops@example.org"\nteam="storage"', 0o644),
        "zone": (b"north", 0o644),
        "identity/name": (b"labelled", 0o644),
        "identity/namespace": (b"default", 0o644),
    }


@check("06-downward-resources.yaml")
def _downward_resources(a: Applied) -> None:
    vol = a.vol("default/sized", "downward-api", "limits")
    assert tmpfs_size(vol) == f"{80 * 1024}k"  # both containers limited: 64Mi + 16Mi
    assert {k: v for k, (v, _) in contents(vol).items()} == {
        "cpu_limit": b"500",
        "cpu_request": b"125",
        "mem_limit": b"64",
        "mem_request": b"32",
        "cpu_limit_cores": b"1",  # 500m with no divisor: rounded up to a whole core
    }


@check("07-projected-sources.yaml")
def _projected_sources(a: Applied) -> None:
    vol = a.vol("default/vault-client", "projected", "bundle")
    assert tmpfs_size(vol) == f"{96 * 1024}k"
    files = contents(vol)
    token, token_mode = files.pop("auth/token")
    assert token_mode == 0o444
    assert files == {
        "config/agent.hcl": (
            b'auto_auth {\n  method "kubernetes" { mount_path = "auth/k8s" }\n}\n',
            0o444,
        ),
        "tls/client.pem": (b"-----placeholder client pem-----", 0o400),
        "pod/labels": (b'app="vault-client"', 0o444),
        "pod/mem_limit": (b"96", 0o444),
    }
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["aud"] == ["vault.example.org"]
    assert claims["sub"] == "system:serviceaccount:default:vault-agent"
    assert claims["exp"] - claims["iat"] == 7200
    assert claims["kubernetes.io"]["pod"] == {
        "name": "vault-client",
        "uid": a.uids["default/vault-client"],
    }


@check("08-kube-api-access-dump.yaml")
def _kube_api_access(a: Applied) -> None:
    pod = "default/api-7d9c5b6f4-x2kqp"
    assert a.uids[pod] == "5f0c8a2e-3b7d-4e19-a6c4-91d2e8f0b3a7"  # the dump's own uid
    vol = a.vol(pod, "projected", "kube-api-access-q7mzt")
    assert tmpfs_size(vol) == GIB_K
    files = contents(vol)
    assert set(files) == {"token", "ca.crt", "namespace"}
    assert {m for _, m in files.values()} == {0o644}
    assert files["namespace"][0] == b"default"
    assert files["ca.crt"][0].startswith(b"-----BEGIN CERTIFICATE-----\nMIIBdzCC")
    claims = token_claims(vol / "token")
    assert claims["sub"] == "system:serviceaccount:default:default"
    assert claims["exp"] - claims["iat"] == 3607


@check("09-emptydir-memory.yaml")
def _emptydir_memory(a: Applied) -> None:
    ram = a.vol("default/cache", "empty-dir", "ram")
    assert tmpfs_size(ram) == f"{48 * 1024}k"  # sizeLimit, below the pod's 256Mi limit
    assert os.listdir(ram) == []
    spill = a.vol("default/cache", "empty-dir", "spill")
    assert tmpfs_size(spill) is None and mode(spill) == 0o777 and os.listdir(spill) == []


@check("10-hostpath-types.yaml")
def _hostpath_types(a: Applied) -> None:
    def record(name: str) -> tuple[str, str]:
        found = host_record(a.vol("default/log-shipper", "host-path", name))
        return found["path"], found.get("type", "")

    assert record("spool") == (str(HOST / "spool"), "DirectoryOrCreate")
    assert record("state") == (str(HOST / "shipper-offsets.db"), "FileOrCreate")
    assert record("source") == (str(HOST / "applogs"), "Directory")
    assert record("untyped")[0] == str(HOST / "applogs")
    spool, state = (HOST / "spool").lstat(), (HOST / "shipper-offsets.db").lstat()
    # made as the kubelet makes them: a 0755 dir, an empty 0644 file, owned by the node
    assert stat.S_ISDIR(spool.st_mode) and stat.S_IMODE(spool.st_mode) == 0o755
    assert stat.S_ISREG(state.st_mode) and stat.S_IMODE(state.st_mode) == 0o644
    assert state.st_size == 0 and (spool.st_uid, state.st_uid) == (0, 0)
    assert (HOST / "applogs/app-2024-03-11.log").read_text() == "GET /healthz 200\n"
    assert record("cursor-file") == (str(HOST / "cursor/position.txt"), "FileOrCreate")
    assert (HOST / "cursor").is_dir() and (HOST / "cursor/position.txt").is_file()


@check("11-pv-pvc-hostpath.yaml")
def _pv_hostpath(a: Applied) -> None:
    found = host_record(a.vol("default/notes", "host-path", "notes-storage"))
    assert found["path"] == str(HOST / "notes")
    assert (HOST / "notes/welcome.txt").read_text() == "first note\n"


@check("12-local-pv-node-affinity.yaml")
def _local_pv_fsgroup(a: Applied) -> None:
    vol = a.vol("default/indexer", "local-volume", "fast-disk-0")
    found = mounts.find_mount(vol)
    assert found is not None
    assert (vol / "segment-0001.idx").read_text() == "index segment\n"
    # the kubelet's SetVolumeOwnership on a local PV: group 4100, rw for it, setgid dirs
    for rel in ("", "shards"):
        st = (HOST / "fast-disk-0" / rel).lstat()
        assert (st.st_gid, stat.S_IMODE(st.st_mode) & 0o2070) == (4100, 0o2070), rel
    for rel in ("segment-0001.idx", "shards/a.bin"):
        st = (HOST / "fast-disk-0" / rel).lstat()
        assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (4100, 0o664), rel


@check("13-fsgroup-emptydir.yaml")
def _fsgroup(a: Applied) -> None:
    work = a.vol("default/ownership-demo", "empty-dir", "workdir")
    st = work.lstat()
    assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (2000, 0o2777)
    token_vol = a.vol("default/ownership-demo", "projected", "kube-api-access-8kd2v")
    files = payload(token_vol)
    assert mode(token_vol / os.readlink(token_vol / DATA_DIR)) == 0o2755
    # the pass starts at the volume's root: the tmpfs root (1777) gains the group and setgid
    assert (token_vol.lstat().st_gid, mode(token_vol)) == (2000, 0o3777)
    # runAsUser and fsGroup: the token is the user's, 0600, then group-readable for fsGroup
    assert (files["token"].mode, files["token"].uid, files["token"].gid) == (0o640, 1000, 2000)
    for name in ("ca.crt", "namespace"):
        assert (files[name].mode, files[name].uid, files[name].gid) == (0o644, 0, 2000), name


@check("14-subpath.yaml")
def _subpath(a: Applied) -> None:
    # subPath is a container-start matter (the kubelet bind-mounts it into the container);
    # the volume itself is mounted whole
    files = a.vol("default/site", "configmap", "files")
    assert contents(files) == {
        "nginx.conf": (b"server { listen 8080; root /srv/site; }\n", 0o644),
        "index.html": (b"<h1>hello</h1>\n", 0o644),
    }
    shared = a.vol("default/site", "empty-dir", "shared")
    assert mode(shared) == 0o777 and os.listdir(shared) == []


@check("15-init-and-sidecar.yaml")
def _init_and_sidecar(a: Applied) -> None:
    work = a.vol("default/report-builder", "empty-dir", "work")
    assert tmpfs_size(work) is None and mode(work) == 0o777


@check("16-deployment-service-configmap.yaml")
def _configmap_beside_skipped(a: Applied) -> None:
    code, out, err = cli(a.svc, "get", "configmaps", "default/frontend-env", "-o", "json")
    assert code == 0, out + err
    assert json.loads(out)["items"][0]["object"]["data"] == {
        "API_URL": "http://api.default.svc:8080",
        "THEME": "dark",
    }


@check("17-yaml-quirks.yaml")
def _yaml_quirks(a: Applied) -> None:
    motd = b"first line\n  indented line\nlast line, no newline after it"
    assert contents(a.vol("default/quirks", "configmap", "octal")) == {
        "motd.txt": (motd, 0o600),
        "folded.txt": (b"these words are folded into one line\n", 0o644),
        "sq.txt": (b"it's quoted", 0o644),
        "tabbed.txt": (b"col1\tcol2\tcol3", 0o644),
        "literal-tab.txt": (b"left\tright", 0o644),
        "number-like.txt": (b"0644", 0o644),
    }
    # the second volume merges the first's source (<<: *alias) and overrides it in decimal
    assert contents(a.vol("default/quirks", "configmap", "decimal")) == {"motd.txt": (motd, 0o600)}


@check("18-kind-list.yaml")
def _kind_list(a: Applied) -> None:
    vol = a.vol("default/greeter", "configmap", "text")
    assert contents(vol) == {"greeting": (b"Hello from a List", 0o644)}


@check("19-pod.json")
def _json_pod(a: Applied) -> None:
    meta = a.vol("default/json-pod", "downward-api", "meta")
    assert tmpfs_size(meta) == f"{32 * 1024}k"
    assert contents(meta) == {"labels": (b'format="json"', 0o444), "name": (b"json-pod", 0o444)}
    assert mode(a.vol("default/json-pod", "empty-dir", "scratch")) == 0o777


def assert_waits(a: Applied, pod: str, reason: str) -> None:
    """`pod` is accepted, Pending, its one volume Unmounted and waiting for `reason`."""
    code, out, err = cli(a.svc, "get", "pods", pod, "-o", "json")
    assert code == 0, out + err
    [found] = json.loads(out)["items"]
    assert found["phase"] == "Pending"
    assert {v["state"] for v in found["volumes"]} == {"Unmounted"}
    [vol] = [v for v in found["volumes"] if v.get("waiting")]
    assert reason in json.dumps(vol["waiting"]), vol
    assert not (a.svc.root_dir / "pods" / a.uids[pod] / "volumes").exists()


UNBOUND = (
    "not bound yet (spec.volumeName is empty; the PV controller binds claims and volfsm has "
    "none: apply the claim with spec.volumeName naming its PersistentVolume)"
)


@check("20-pvc-dynamic-unbound.yaml")
def _unbound_claim_waits(a: Applied) -> None:
    assert_waits(a, "default/uploader", f"PersistentVolumeClaim default/uploads: {UNBOUND}")


@check("21-namespace-tls-secret.yaml")
def _tls_secret(a: Applied) -> None:
    files = contents(a.vol("payments/checkout", "secret", "tls"))
    assert set(files) == {"tls.crt", "tls.key"}
    assert files["tls.key"] == (
        b"-----BEGIN PRIVATE KEY-----\nplaceholder key body\n-----END PRIVATE KEY-----\n",
        0o644,
    )


@check("22-unsupported-nfs.yaml")
def _nfs_refused(a: Applied) -> None:
    assert "default/archive-reader" not in node_pods(a)  # nothing of the file was applied


@check("23-crlf-line-ends.yaml")
def _crlf(a: Applied) -> None:
    vol = a.vol("default/dos-lines", "configmap", "note")
    assert contents(vol) == {"note.txt": (b"saved on a machine with CRLF line ends\n", 0o644)}


@check("24-immutable-and-registry-secret.yaml")
def _immutable_and_registry(a: Applied) -> None:
    release = contents(a.vol("default/release-checker", "configmap", "release"))
    assert release == {
        "version": (b"v3.2.1", 0o644),
        "build": (b"20240311.4", 0o644),
        "logo.png": (base64.b64decode("iVBORw0KGgo="), 0o644),
    }
    docker = contents(a.vol("default/release-checker", "secret", "docker"))
    assert json.loads(docker["config.json"][0]) == {
        "auths": {"registry.example.org": {"auth": "dXNlcjpwYXNz"}}
    }


@check("25-duplicate-key.yaml")
def _duplicate_key(a: Applied) -> None:
    assert "default/twice" not in node_pods(a)  # nothing of the file was applied


@check("26-hugepages.yaml")
def _hugepages_refused(a: Applied) -> None:
    assert "default/dpdk-worker" not in node_pods(a)


@check("27-generic-ephemeral.yaml")
def _generic_ephemeral_waits(a: Applied) -> None:
    assert_waits(
        a,
        "default/batch-scratch",
        "PersistentVolumeClaim default/batch-scratch-scratch-volume: not found yet; the "
        "ephemeral volume controller makes it from volumeClaimTemplate and volfsm has none",
    )


@check("28-static-pv-unbound-claim.yaml")
def _static_pv_unbound_claim_waits(a: Applied) -> None:
    assert_waits(a, "default/shelf", f"PersistentVolumeClaim default/shelf-claim: {UNBOUND}")
    assert not (HOST / "shelf").exists()


# ------------------------------------------------------- what the API server would add

OWN_TOKEN_VOLUME = {
    "default/api-7d9c5b6f4-x2kqp": "kube-api-access-q7mzt",  # 08: the kubectl dump
    "default/ownership-demo": "kube-api-access-8kd2v",  # 13: written with the volume
}
"""Pods that carry their kube-api-access-* volume: admission adds none."""
NO_TOKEN = {"default/release-checker"}
"""Pods with `automountServiceAccountToken: false` (file 24)."""
MOUNTED_PODS = sorted(
    (name, pod) for name, e in EXPECT.items() for pod in set(e.pods) - set(e.pending)
)


def stored_config_map(a: Applied, key: str) -> dict[str, Any]:
    code, out, err = cli(a.svc, "get", "configmaps", key, "-o", "json")
    assert code == 0, out + err
    found: dict[str, Any] = json.loads(out)["items"][0]["object"]
    return found


@pytest.mark.parametrize(("name", "pod"), MOUNTED_PODS)
def test_each_pod_has_the_token_volume_the_api_server_would_give_it(
    applied: Applied, name: str, pod: str
) -> None:
    _, out, _ = applied.results[name]
    own = OWN_TOKEN_VOLUME.get(pod)
    volume = own or api_access_name(applied.uids[pod])
    line = f"pod/{pod}: added volume {volume} (service-account token"
    assert (line in out) is (own is None and pod not in NO_TOKEN), out
    vol = applied.vol(pod, "projected", volume)
    if pod in NO_TOKEN:
        assert not vol.parent.exists()
        return
    assert mounts.find_mount(vol) is not None
    files = payload(vol)
    assert set(files) == {"token", "ca.crt", "namespace"}
    namespace = pod.split("/")[0]
    assert files["namespace"].content == namespace.encode()
    ca = stored_config_map(applied, f"{namespace}/kube-root-ca.crt")["data"]["ca.crt"]
    assert files["ca.crt"].content == ca.encode()
    claims = token_claims(vol / "token")
    assert claims["exp"] - claims["iat"] == 3607
    assert claims["kubernetes.io"]["pod"]["uid"] == applied.uids[pod]


def test_kube_root_ca_is_published_where_none_was_applied(applied: Applied) -> None:
    # default: volfsm published one at the first pod (file 01), file 08 applied the
    # cluster's over it; payments (file 21): volfsm's, from the node-local CA
    first = applied.results["01-configmap-volume.yaml"][1]
    published = "created (published by volfsm from the node-local CA)"
    assert f"configmap/default/kube-root-ca.crt {published}" in first
    dump = applied.results["08-kube-api-access-dump.yaml"][1]
    assert "configmap/default/kube-root-ca.crt configured" in dump
    default = stored_config_map(applied, "default/kube-root-ca.crt")
    assert default["data"]["ca.crt"].startswith("-----BEGIN CERTIFICATE-----\nMIIBdzCC")
    assert "volfsm.io/published-by" not in default["metadata"]["annotations"]
    payments = stored_config_map(applied, "payments/kube-root-ca.crt")
    assert payments["metadata"]["annotations"]["volfsm.io/published-by"] == "volfsm"
    assert payments["data"]["ca.crt"].startswith("-----BEGIN CERTIFICATE-----\n")


def test_every_file_has_a_volume_check() -> None:
    assert sorted(CHECKS) == sorted(EXPECT)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_volumes_are_what_the_kubelet_makes(applied: Applied, name: str) -> None:
    expect = EXPECT[name]
    for pod in set(expect.pods) - set(expect.pending):
        code, out, err = cli(applied.svc, "wait", "pod", pod, "--for", "mounted", "--timeout", "5")
        assert code == 0, out + err
    CHECKS[name](applied)


# ------------------------------------------------------------------ teardown


def test_deleting_every_pod_unmounts_all_and_keeps_the_host_data(applied: Applied) -> None:
    pods = sorted(applied.uids)
    for pod in pods:
        code, out, err = cli(applied.svc, "delete", "pod", pod)
        assert code == 0, out + err
    for pod in pods:
        code, out, err = cli(
            applied.svc, "wait", "pod", pod, "--for", "unmounted", "--timeout", "30"
        )
        assert code == 0, out + err
    assert mounts.mounts_under(applied.svc.root_dir) == []
    until("every pod dir removed", lambda: os.listdir(applied.svc.root_dir / "pods") == [])
    # hostPath and local PV data: exactly as it was while mounted (the kubelet never deletes
    # it), the dir and file the DirectoryOrCreate and FileOrCreate volumes made included
    assert _host_tree() == applied.host_mounted
    made = {"spool", "shipper-offsets.db", "cursor/position.txt", "applogs/app-2024-03-11.log"}
    assert made <= set(_host_tree())
    assert (HOST / "fast-disk-0/shards/a.bin").read_text() == "shard a\n"
