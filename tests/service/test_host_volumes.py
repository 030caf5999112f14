"""hostPath volumes and the fsGroup ownership pass, end to end through a real `volfsm serve`.

One service for the module; host paths live in the test's tmp dir (outside
the root dir), device nodes are made with mknod. The tests run in order as
one story: mount, fail, tear down, restart.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from events.types import VolumeMounted
from tests.helpers.asuser import run_as_member
from tests.service.helpers import ServeProcess, cli, unmount_under, until

FS_GROUP = 2345
USER = 1000
ALLOCATABLE_MIB = 512
MIB = 1 << 20


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, Path]]:
    """A running service and a host dir holding one of each kind of file."""
    tmp = tmp_path_factory.mktemp("hostvol")
    host = tmp / "host"
    host.mkdir()
    (host / "dir").mkdir()
    (host / "file").write_text("kept\n")
    os.mknod(host / "char", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(host / "block", 0o600 | stat.S_IFBLK, os.makedev(7, 250))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(host / "sock"))
    svc = ServeProcess(
        tmp / "svc",
        args=["--node-allocatable", f"memory={ALLOCATABLE_MIB}Mi", "--node-labels", "zone=a"],
    )
    svc.workdir.mkdir()
    try:
        svc.start()
        yield svc, host
    finally:
        svc.kill()
        sock.close()
        unmount_under(tmp)


def apply_pod(
    svc: ServeProcess,
    tmp: Path,
    name: str,
    volumes: list[dict[str, Any]],
    containers: list[dict[str, Any]] | None = None,
    **sc: Any,
) -> None:
    spec: dict[str, Any] = {"volumes": volumes, **({"securityContext": sc} if sc else {})}
    if containers:
        spec["containers"] = containers
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": spec,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(pod))
    code, out, err = cli(svc, "apply", "-f", str(path))
    assert code == 0, out + err


def host_vol(name: str, path: Path, kind: str = "") -> dict[str, Any]:
    src: dict[str, Any] = {"path": str(path)}
    if kind:
        src["type"] = kind
    return {"name": name, "hostPath": src}


def pod_volumes(svc: ServeProcess, name: str) -> dict[str, dict[str, Any]]:
    code, out, err = cli(svc, "get", "pods", f"default/{name}", "-o", "json")
    assert code == 0, err
    [pod] = json.loads(out)["items"]
    return {vol["name"]: vol for vol in pod["volumes"]}


def wait_mounted(svc: ServeProcess, name: str) -> None:
    code, out, err = cli(
        svc, "wait", "pod", f"default/{name}", "--for", "mounted", "--timeout", "60"
    )
    assert code == 0, out + err


def mounted_events(svc: ServeProcess, pod_uid: str) -> dict[str, VolumeMounted]:
    with svc.open_log() as log:
        return {
            env.body.volume_name: env.body
            for env in log.read_after(0)
            if isinstance(env.body, VolumeMounted) and env.body.pod_uid == pod_uid
        }


def test_every_host_path_type_that_fits_mounts(world: tuple[ServeProcess, Path]) -> None:
    svc, host = world
    volumes = [
        host_vol("unset-missing", host / "nothing-here"),
        host_vol("dir-create", host / "made" / "deep", "DirectoryOrCreate"),
        host_vol("file-create", host / "made-file", "FileOrCreate"),
        host_vol("dir-create-present", host / "dir", "DirectoryOrCreate"),
        host_vol("file-create-present", host / "file", "FileOrCreate"),
        host_vol("dir", host / "dir", "Directory"),
        host_vol("file", host / "file", "File"),
        host_vol("sock", host / "sock", "Socket"),
        host_vol("char", host / "char", "CharDevice"),
        host_vol("block", host / "block", "BlockDevice"),
    ]
    # a hostPath is the node's: the pod's fsGroup is never applied to it
    apply_pod(svc, host.parent, "hp-ok", volumes, fsGroup=FS_GROUP)
    wait_mounted(svc, "hp-ok")
    assert not (host / "nothing-here").exists()
    assert stat.S_IMODE((host / "made" / "deep").stat().st_mode) == 0o755 & ~current_umask()
    assert stat.S_IMODE((host / "made").stat().st_mode) == 0o755 & ~current_umask()
    made = (host / "made-file").stat()
    assert stat.S_ISREG(made.st_mode) and made.st_size == 0
    assert stat.S_IMODE(made.st_mode) == 0o644 & ~current_umask()
    assert (host / "file").read_text() == "kept\n"
    assert (host / "dir").stat().st_gid != FS_GROUP
    mounted = mounted_events(svc, "uid-hp-ok")
    assert mounted["dir"].mount_path == str(host / "dir")  # the path is in the log
    assert mounted["dir"].ownership == ""


def test_wrong_kinds_and_missing_paths_are_refused_with_the_kubelets_message(
    world: tuple[ServeProcess, Path],
) -> None:
    svc, host = world
    cases = {
        "dir-on-file": (host / "file", "Directory", "is not a directory"),
        "dir-missing": (host / "absent-dir", "Directory", "is not a directory"),
        "file-on-dir": (host / "dir", "File", "is not a file"),
        "file-missing": (host / "absent-file", "File", "is not a file"),
        "filecreate-on-dir": (host / "dir", "FileOrCreate", "is not a file"),
        "dircreate-on-file": (host / "file", "DirectoryOrCreate", "is not a directory"),
        "filecreate-no-parent": (host / "no-parent" / "f", "FileOrCreate", "ENOENT"),
        "sock-on-file": (host / "file", "Socket", "is not a socket file"),
        "char-on-block": (host / "block", "CharDevice", "is not a character device"),
        "block-on-char": (host / "char", "BlockDevice", "is not a block device"),
    }
    volumes = [host_vol(name, path, kind) for name, (path, kind, _) in cases.items()]
    apply_pod(svc, host.parent, "hp-bad", volumes)

    def all_failed() -> dict[str, dict[str, Any]] | None:
        found = pod_volumes(svc, "hp-bad")
        done = len(found) == len(cases) and all(
            cases[n][2] in json.dumps(v) for n, v in found.items()
        )
        return found if done else None

    found = until("every hostPath volume failed with its reason", all_failed)
    assert all(vol["state"] != "Mounted" for vol in found.values())
    assert not (host / "absent-dir").exists() and not (host / "absent-file").exists()
    assert not (host / "no-parent").exists()
    code, _, err = cli(svc, "delete", "pod", "default/hp-bad")
    assert code == 0, err


def test_teardown_removes_nothing_and_the_volumes_survive_a_restart(
    world: tuple[ServeProcess, Path],
) -> None:
    svc, host = world
    (host / "made" / "deep" / "written").write_text("by the pod\n")
    svc.stop()
    svc.start()
    wait_mounted(svc, "hp-ok")
    assert {v["state"] for v in pod_volumes(svc, "hp-ok").values()} == {"Mounted"}
    code, _, err = cli(svc, "delete", "pod", "default/hp-ok")
    assert code == 0, err
    code, out, err = cli(
        svc, "wait", "pod", "default/hp-ok", "--for", "unmounted", "--timeout", "60"
    )
    assert code == 0, out + err
    assert (host / "made" / "deep" / "written").read_text() == "by the pod\n"
    assert (host / "made-file").is_file() and (host / "file").read_text() == "kept\n"
    assert stat.S_ISSOCK((host / "sock").lstat().st_mode)
    assert stat.S_ISCHR((host / "char").lstat().st_mode)
    assert stat.S_ISBLK((host / "block").lstat().st_mode)


def test_fs_group_makes_an_empty_dir_writable_for_a_user_in_the_group(
    world: tuple[ServeProcess, Path],
) -> None:
    svc, host = world
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    apply_pod(svc, host.parent, "fsg", volumes, fsGroup=FS_GROUP, runAsUser=USER)
    wait_mounted(svc, "fsg")
    for name in ("scratch", "shm"):
        path = Path(pod_volumes(svc, "fsg")[name]["mount_path"])
        st = path.stat()
        assert st.st_gid == FS_GROUP and st.st_mode & stat.S_ISGID
        assert stat.S_IMODE(st.st_mode) & 0o070 == 0o070
        run_as_member(path, USER, FS_GROUP, "by-user", "sub")
        assert (path / "by-user").stat().st_gid == FS_GROUP  # setgid: new files get the group
        assert (path / "sub").stat().st_gid == FS_GROUP
    mounted = mounted_events(svc, "uid-fsg")
    assert mounted["scratch"].ownership.startswith(f"fsGroup {FS_GROUP}: 1 entries walked")
    assert mounted["scratch"].ownership_s > 0
    code, _, err = cli(svc, "delete", "pod", "default/fsg")
    assert code == 0, err


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def tmpfs_size(path: str) -> int:
    """The size= of the tmpfs mounted at `path`, in bytes (mountinfo's super options)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            if left.split(" ")[4] == path and right.startswith("tmpfs "):
                options = right.split(" ")[2].split(",")
                [size] = [o[len("size=") :] for o in options if o.startswith("size=")]
                assert size.endswith("k")
                return int(size[:-1]) * 1024
    raise AssertionError(f"no tmpfs at {path}")


def memory_volume(name: str, size_limit: str = "") -> dict[str, Any]:
    empty: dict[str, Any] = {"medium": "Memory"}
    if size_limit:
        empty["sizeLimit"] = size_limit
    return {"name": name, "emptyDir": empty}


def test_memory_empty_dir_size_follows_the_kubelets_rule(world: tuple[ServeProcess, Path]) -> None:
    svc, host = world
    apply_pod(svc, host.parent, "mem-unbounded", [memory_volume("shm")])
    containers = [
        {"name": "a", "resources": {"limits": {"memory": "40Mi"}}},
        {"name": "b", "resources": {"limits": {"memory": "24Mi"}}},
    ]
    volumes = [
        memory_volume("plain"),
        memory_volume("over", "128Mi"),
        memory_volume("under", "8Mi"),
    ]
    apply_pod(svc, host.parent, "mem-limited", volumes, containers=containers)
    sizes = {}
    for pod in ("mem-unbounded", "mem-limited"):
        wait_mounted(svc, pod)
        for name, vol in pod_volumes(svc, pod).items():
            # the token volume admission gave mem-limited: a projected tmpfs, the same rule
            key = "token" if name.startswith("kube-api-access-") else name
            sizes[key] = tmpfs_size(vol["mount_path"])
    assert sizes == {
        "shm": ALLOCATABLE_MIB * MIB,  # no limit anywhere: node allocatable memory
        "plain": 64 * MIB,  # the pod's limit: the sum of its containers'
        "over": 64 * MIB,  # a sizeLimit above the pod's limit is ignored
        "under": 8 * MIB,
        "token": 64 * MIB,
    }
    for pod in ("mem-unbounded", "mem-limited"):
        assert cli(svc, "delete", "pod", f"default/{pod}")[0] == 0


def local_pv(name: str, path: Path, node: str, mode: str = "Filesystem") -> list[dict[str, Any]]:
    """A local PV pinned to `node` in zone a (the service's --node-labels), and its claim."""
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]},
            {"key": "zone", "operator": "In", "values": ["a"]},
        ]
    }
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "local": {"path": str(path)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
            "claimRef": {"namespace": "default", "name": f"{name}-claim"},
            "volumeMode": mode,
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{name}-claim", "namespace": "default"},
        "spec": {"volumeName": name, "accessModes": ["ReadWriteOnce"], "volumeMode": mode},
        "status": {"phase": "Bound"},
    }
    return [volume, claim]


def apply_objects(
    svc: ServeProcess, tmp: Path, name: str, objects: list[dict[str, Any]]
) -> tuple[int, str]:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    code, out, err = cli(svc, "apply", "-f", str(path))
    return code, out + err


def test_a_local_pv_mounts_on_its_node_and_is_refused_elsewhere(
    world: tuple[ServeProcess, Path],
) -> None:
    svc, host = world
    data = host / "local-disk"
    data.mkdir()
    (data / "kept").write_text("data\n")
    node = (svc.data_dir / "node").read_text().strip()
    code, text = apply_objects(
        svc, host.parent, "local-other", local_pv("pv-far", data, "other-node")
    )
    assert code != 0 and "nodeAffinity does not match this node" in text
    code, text = apply_objects(svc, host.parent, "local-here", local_pv("pv-here", data, node))
    assert code == 0, text
    claim = {"name": "disk", "persistentVolumeClaim": {"claimName": "pv-here-claim"}}
    apply_pod(svc, host.parent, "local-pod", [claim], fsGroup=FS_GROUP)
    wait_mounted(svc, "local-pod")
    path = Path(pod_volumes(svc, "local-pod")["disk"]["mount_path"])
    assert path.name == "pv-here" and (path / "kept").read_text() == "data\n"
    assert mounted_events(svc, "uid-local-pod")["disk"].ownership.startswith(f"fsGroup {FS_GROUP}")
    assert data.stat().st_gid == FS_GROUP and (data / "kept").stat().st_gid == FS_GROUP
    (path / "by-pod").write_text("x")
    svc.stop()  # a restart finds the bind mount the log recorded
    svc.start()
    wait_mounted(svc, "local-pod")
    assert pod_volumes(svc, "local-pod")["disk"]["state"] == "Mounted"
    assert cli(svc, "delete", "pod", "default/local-pod")[0] == 0
    code, out, err = cli(
        svc, "wait", "pod", "default/local-pod", "--for", "unmounted", "--timeout", "60"
    )
    assert code == 0, out + err
    assert not path.exists()  # the pod's dir went; the local path and its data stay
    assert (data / "kept").read_text() == "data\n" and (data / "by-pod").read_text() == "x"


def test_a_local_pv_on_a_block_device_is_formatted_once_and_mounted(
    world: tuple[ServeProcess, Path],
) -> None:
    svc, host = world
    image = host / "local-block.img"
    with image.open("wb") as f:
        f.truncate(64 * MIB)
    device = subprocess.run(
        ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        node = (svc.data_dir / "node").read_text().strip()
        code, text = apply_objects(
            svc, host.parent, "local-blk", local_pv("pv-blk", Path(device), node)
        )
        assert code == 0, text
        claim = {"name": "disk", "persistentVolumeClaim": {"claimName": "pv-blk-claim"}}
        apply_pod(svc, host.parent, "blk-pod", [claim])
        wait_mounted(svc, "blk-pod")
        path = Path(pod_volumes(svc, "blk-pod")["disk"]["mount_path"])
        (path / "on-disk").write_text("kept on the device\n")
        assert (
            subprocess.run(
                ["blkid", "-o", "value", "-s", "TYPE", device], capture_output=True, text=True
            ).stdout.strip()
            == "ext4"
        )
        global_mount = (
            svc.root_dir / "plugins" / "kubernetes.io" / "local-volume" / "mounts" / "pv-blk"
        )
        assert os.path.ismount(global_mount)
        assert cli(svc, "delete", "pod", "default/blk-pod")[0] == 0
        code, out, err = cli(
            svc, "wait", "pod", "default/blk-pod", "--for", "unmounted", "--timeout", "60"
        )
        assert code == 0, out + err
        assert not os.path.ismount(global_mount) and not path.exists()
        check = host / "check"
        check.mkdir()
        subprocess.run(["mount", "-o", "ro", device, str(check)], check=True)
        try:
            assert (check / "on-disk").read_text() == "kept on the device\n"  # data stays
        finally:
            subprocess.run(["umount", str(check)], check=True)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


MARKER = b"volfsm block marker\n"


def test_a_block_local_pv_is_mapped_for_the_pod_and_its_device_is_never_written(
    world: tuple[ServeProcess, Path],
) -> None:
    svc, host = world
    image = host / "local-raw.img"
    with image.open("wb") as f:
        f.truncate(16 * MIB)
        f.seek(MIB)
        f.write(MARKER)
    device = subprocess.run(
        ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        node = (svc.data_dir / "node").read_text().strip()
        objects = local_pv("pv-raw", Path(device), node, "Block")
        objects += local_pv("pv-notblk", host / "dir", node, "Block")
        code, text = apply_objects(svc, host.parent, "local-raw", objects)
        assert code == 0, text
        raw = {"name": "raw", "persistentVolumeClaim": {"claimName": "pv-raw-claim"}}
        apply_pod(svc, host.parent, "raw-pod", [raw])
        wait_mounted(svc, "raw-pod")

        # the pod's volumeDevices path is the device, the marker readable through it
        link = svc.root_dir / "pods" / "uid-raw-pod" / "volumeDevices"
        link = link / "kubernetes.io~local-volume" / "pv-raw"
        assert os.readlink(link) == device and stat.S_ISBLK(link.stat().st_mode)
        with link.open("rb") as dev:
            dev.seek(MIB)
            assert dev.read(len(MARKER)) == MARKER
        global_map = svc.root_dir / "plugins" / "kubernetes.io~local-volume" / "volumeDevices"
        bound = global_map / "pv-raw" / "uid-raw-pod"
        assert os.path.ismount(bound) and os.stat(bound).st_rdev == os.stat(device).st_rdev
        assert blkid_type(device) == ""  # never formatted
        svc.stop()  # a restart finds the map the log recorded
        svc.start()
        wait_mounted(svc, "raw-pod")
        assert pod_volumes(svc, "raw-pod")["raw"]["state"] == "Mounted"
        assert os.path.ismount(bound) and os.readlink(link) == device

        # a directory is no block device: refused with the reason, nothing made
        bad = {"name": "bad", "persistentVolumeClaim": {"claimName": "pv-notblk-claim"}}
        apply_pod(svc, host.parent, "notblk-pod", [bad])
        reason = "is a directory: volumeMode Block needs a block device"
        until(
            "the Block volume on a directory failed",
            lambda: reason in json.dumps(pod_volumes(svc, "notblk-pod")),
        )
        assert not (global_map / "pv-notblk").exists()

        # delete: only volfsm's links and binds go; the device keeps its data
        for pod in ("raw-pod", "notblk-pod"):
            assert cli(svc, "delete", "pod", f"default/{pod}")[0] == 0
        code, out, err = cli(
            svc, "wait", "pod", "default/raw-pod", "--for", "unmounted", "--timeout", "60"
        )
        assert code == 0, out + err
        until("the global map dir removed", lambda: not (global_map / "pv-raw").exists())
        assert not os.path.lexists(link)
        with open(device, "rb") as dev:
            dev.seek(MIB)
            assert dev.read(len(MARKER)) == MARKER
        assert image.stat().st_size == 16 * MIB and blkid_type(device) == ""
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


def blkid_type(device: str) -> str:
    """The signature blkid finds on `device` ("" if none)."""
    done = subprocess.run(
        ["blkid", "-p", "-o", "value", "-s", "TYPE", device], capture_output=True, text=True
    )
    return done.stdout.strip()
