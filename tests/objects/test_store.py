"""The object store on its own: durable writes, modes, publish/revert, crash recovery, views."""

from __future__ import annotations

import base64
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.desired.builders import can_serve, pv
from volfsm.desired import DesiredStateOfWorld
from volfsm.desired.meta import LabelSelector
from volfsm.desired.plan import AppliedObject
from volfsm.objects import ObjectChange, ObjectStore, listing

SECRET_VALUE = "s3cr3t-pa55w0rd"
PEM = (
    "-----BEGIN CERTIFICATE-----\n"
    + base64.b64encode(b"not a real certificate, but base64").decode()
    + "\n-----END CERTIFICATE-----\n"
)


def config_map(name: str = "app", **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": data or {"a": "1"},
    }


def secret(name: str = "db", value: str = SECRET_VALUE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "shop"},
        "data": {"user": base64.b64encode(b"admin").decode()},
        "stringData": {"password": value},
    }


def bundle(name: str, signer: str = "", labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec = {"trustBundle": PEM, **({"signerName": signer} if signer else {})}
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    return {
        "apiVersion": "certificates.k8s.io/v1beta1",
        "kind": "ClusterTrustBundle",
        "metadata": meta,
        "spec": spec,
    }


def planned(store: ObjectStore, *objects: dict[str, Any]) -> list[AppliedObject]:
    """What an apply of `objects` would write (the engine plans with the DSW and the store)."""
    return DesiredStateOfWorld(can_serve).plan_apply(list(objects), store).stored_changes


def commit(store: ObjectStore, *objects: dict[str, Any]) -> list[ObjectChange]:
    """Write and publish (as the engine does once the events are logged)."""
    return store.publish(store.write(planned(store, *objects)))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ObjectStore]:
    opened = ObjectStore.beside(tmp_path / "volfsm.db")
    opened.open()
    yield opened
    opened.close()


def test_dir_and_file_are_root_only_and_objects_survive_a_reopen(tmp_path: Path) -> None:
    store = ObjectStore.beside(tmp_path / "volfsm.db")
    store.open()
    commit(store, config_map(), secret(), pv())
    assert store.directory == tmp_path / "objects"
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    files = sorted(p.name for p in store.directory.iterdir())
    assert files == ["objects.db", "objects.db-shm", "objects.db-wal"]
    for name in files:
        assert stat.S_IMODE((store.directory / name).stat().st_mode) == 0o600, name
    store.close()
    again = ObjectStore.beside(tmp_path / "volfsm.db")
    again.open()
    assert [o.label for o in again.objects()] == [
        "ConfigMap default/app",
        "PersistentVolume pv-data",
        "Secret shop/db",
    ]
    found = again.secret("shop", "db")
    assert found is not None and found.data == {"password": SECRET_VALUE.encode(), "user": b"admin"}
    assert SECRET_VALUE not in repr(found) and "password" in repr(found)
    again.close()


def test_a_loose_store_dir_is_tightened(tmp_path: Path) -> None:
    (tmp_path / "objects").mkdir(mode=0o755)
    (tmp_path / "objects").chmod(0o755)
    store = ObjectStore.beside(tmp_path / "volfsm.db")
    store.open()
    assert stat.S_IMODE((tmp_path / "objects").stat().st_mode) == 0o700
    store.close()


def test_versions_hashes_and_actions(store: ObjectStore) -> None:
    [created] = commit(store, config_map(a="1"))
    assert (created.kind, created.namespace, created.name) == ("ConfigMap", "default", "app")
    assert created.content_hash.startswith("sha256:") and not created.deleted
    assert planned(store, config_map(a="1")) == []  # unchanged: nothing to write
    [changed] = planned(store, config_map(a="2"))
    assert changed.action == "configured" and changed.uid == created.uid
    [configured] = store.publish(store.write([changed]))
    assert configured.resource_version > created.resource_version
    assert configured.content_hash != created.content_hash
    stored = store.get("ConfigMap", "default", "app")
    assert stored is not None and stored.raw["metadata"]["resourceVersion"] == str(
        configured.resource_version
    )
    replaced = config_map(a="2")
    replaced["metadata"]["uid"] = "new-uid"
    assert [a.action for a in planned(store, replaced)] == ["replaced"]


def test_a_secret_hash_is_keyed_and_stringdata_is_merged(store: ObjectStore) -> None:
    [change] = commit(store, secret())
    assert change.content_hash.startswith("hmac-sha256:")
    stored = store.get("Secret", "shop", "db")
    assert stored is not None and "stringData" not in stored.raw
    assert set(stored.raw["data"]) == {"password", "user"}
    other = ObjectStore(None)
    other.open()
    assert other.content_hash("Secret", stored.raw) != change.content_hash  # another node's key


def test_readers_see_a_write_only_once_it_is_published(store: ObjectStore) -> None:
    seen: list[list[ObjectChange]] = []
    unsubscribe = store.subscribe(seen.append)
    writes = store.write(planned(store, config_map()))
    assert store.get("ConfigMap", "default", "app") is None and seen == []
    store.publish(writes)
    assert store.config_map("default", "app") is not None
    assert [[c.name for c in batch] for batch in seen] == [["app"]]
    unsubscribe()
    commit(store, config_map("other"))
    assert len(seen) == 1


def test_revert_undoes_a_write_whose_events_were_not_logged(tmp_path: Path) -> None:
    store = ObjectStore.beside(tmp_path / "volfsm.db")
    store.open()
    commit(store, config_map(a="1"))
    writes = store.write(planned(store, config_map(a="2"), config_map("new")))
    store.revert(writes)
    store.close()
    again = ObjectStore.beside(tmp_path / "volfsm.db")
    again.open()
    found = again.config_map("default", "app")
    assert found is not None and found.data == {"a": "1"}
    assert again.get("ConfigMap", "default", "new") is None
    again.close()


def test_recovery_keeps_what_the_log_has_and_rolls_back_the_rest(tmp_path: Path) -> None:
    store = ObjectStore.beside(tmp_path / "volfsm.db")
    store.open()
    commit(store, config_map("kept", a="1"), config_map("lost", a="1"), config_map("gone"))
    writes = store.write(planned(store, config_map("kept", a="2"), config_map("lost", a="2")))
    writes += store.write([], [("ConfigMap", "default", "gone")])
    rv = {w.key[2]: w.resource_version for w in writes}
    # the process dies here: nothing published; the log got the events of "kept" and "gone"
    store._conn = None
    logged = {
        ("ConfigMap", "default", "kept"): ("ObjectApplied", rv["kept"]),
        ("ConfigMap", "default", "gone"): ("ObjectDeleted", rv["gone"]),
    }
    again = ObjectStore.beside(tmp_path / "volfsm.db")
    again.open(logged.get)
    kept, lost = again.config_map("default", "kept"), again.config_map("default", "lost")
    assert kept is not None and kept.data == {"a": "2"}
    assert lost is not None and lost.data == {"a": "1"}
    assert again.get("ConfigMap", "default", "gone") is None
    again.close()


def test_deleting_publishes_a_deleted_change(store: ObjectStore) -> None:
    commit(store, config_map())
    [change] = store.publish(store.write([], [("ConfigMap", "default", "app")]))
    assert change.deleted and store.get("ConfigMap", "default", "app") is None
    assert store.write([], [("ConfigMap", "default", "app")]) == []  # gone: a no-op


def test_cluster_trust_bundles_by_name_and_by_signer_and_labels(store: ObjectStore) -> None:
    commit(
        store,
        bundle("plain"),
        bundle("example.com:ca:one", "example.com/ca", {"tier": "gold"}),
        bundle("example.com:ca:two", "example.com/ca", {"tier": "silver"}),
        bundle("other.io:x:one", "other.io/x", {"tier": "gold"}),
    )
    assert store.cluster_trust_bundle("plain") is not None
    gold = LabelSelector(match_labels={"tier": "gold"})
    assert [o.name for o in store.cluster_trust_bundles("example.com/ca", gold)] == [
        "example.com:ca:one"
    ]
    everything = store.cluster_trust_bundles("example.com/ca", LabelSelector())
    assert [o.name for o in everything] == ["example.com:ca:one", "example.com:ca:two"]
    assert store.cluster_trust_bundles("example.com/ca", None) == []  # nil selects nothing


def test_csi_driver_spec_has_the_api_servers_defaults(store: ObjectStore) -> None:
    driver = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": "csi.example.com"},
        "spec": {
            "podInfoOnMount": True,
            "tokenRequests": [{"audience": "vault", "expirationSeconds": 3600}],
            "volumeLifecycleModes": [],
        },
    }
    commit(store, driver)
    found = store.csi_driver("csi.example.com")
    assert found is not None
    spec = found.spec
    assert spec.attach_required and spec.pod_info_on_mount and not spec.requires_republish
    assert spec.fs_group_policy == "ReadWriteOnceWithFSType"
    assert spec.volume_lifecycle_modes == ("Persistent",)
    assert [(t.audience, t.expiration_seconds) for t in spec.token_requests] == [("vault", 3600)]


def test_listing_never_shows_a_secret_value(store: ObjectStore) -> None:
    commit(store, secret(), config_map())
    [item] = listing(store, "secrets")
    assert "object" not in item
    assert item["summary"]["keys"] == {"password": len(SECRET_VALUE), "user": 5}
    assert SECRET_VALUE not in repr(item)
    encoded = base64.b64encode(SECRET_VALUE.encode()).decode()
    assert encoded not in repr(item)
    [cm] = listing(store, "configmaps")
    assert cm["object"]["data"] == {"a": "1"} and cm["summary"]["keys"] == {"a": 1}
