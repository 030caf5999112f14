"""Store first, then the log, then publish: the keeper against a real event log."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from events.log import ANY_VERSION, EventLog
from events.types import Envelope, ObjectApplied, ObjectDeleted
from projections.validate import validate
from tests.objects.test_store import config_map, planned, secret
from volfsm.desired.plan import DesiredChange
from volfsm.objects import ObjectKeeper, ObjectStore
from volfsm.objects.records import NO_RECORD

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "uid": "uid-web"},
    "spec": {"volumes": []},
}


class Keeper:
    """A keeper on `<tmp>/volfsm.db` whose recording can be made to fail."""

    def __init__(self, tmp: Path) -> None:
        self.log = EventLog(tmp / "volfsm.db", node="n1")
        self.store = ObjectStore.beside(self.log.path)
        self.fail = False
        self.keeper = ObjectKeeper(self.store, self.log, self.record)

    async def record(self, changes: Sequence[DesiredChange]) -> list[Envelope]:
        if self.fail:
            raise OSError("disk full")
        envs: list[Envelope] = []
        for change in changes:
            envs += await self.log.append_async(change.stream, ANY_VERSION, [change.body])
        return envs

    def close(self) -> None:
        self.store.close()
        self.log.close()


async def test_a_change_that_cannot_be_logged_is_rolled_back(tmp_path: Path) -> None:
    k = Keeper(tmp_path)
    await k.keeper.open()
    envs = await k.keeper.commit(planned(k.store, config_map(a="1")), [])
    assert [type(e.body) for e in envs] == [ObjectApplied]
    k.fail = True
    with pytest.raises(OSError):
        await k.keeper.commit(planned(k.store, config_map(a="2"), secret()), [])
    found = k.store.config_map("default", "app")
    assert found is not None and found.data == {"a": "1"} and k.store.secret("shop", "db") is None
    k.close()
    again = ObjectStore.beside(tmp_path / "volfsm.db")
    again.open()
    reopened = again.config_map("default", "app")
    assert reopened is not None and reopened.data == {"a": "1"}
    again.close()


async def test_a_new_log_beside_an_old_store_records_its_objects_and_drops_its_pods(
    tmp_path: Path,
) -> None:
    k = Keeper(tmp_path)
    await k.keeper.open()
    await k.keeper.commit(planned(k.store, config_map(), secret(), POD), [])
    k.close()
    for name in ("volfsm.db", "volfsm.db-wal", "volfsm.db-shm"):  # the log is lost
        (tmp_path / name).unlink(missing_ok=True)
    k = Keeper(tmp_path)
    await k.keeper.open()
    await k.keeper.settle_start(desired_pods=())
    assert [o.label for o in k.store.objects()] == ["ConfigMap default/app", "Secret shop/db"]
    envs = list(k.log.read_after(0))
    assert [(e.type, e.body.kind) for e in envs] == [  # type: ignore[union-attr]
        ("ObjectApplied", "ConfigMap"),
        ("ObjectApplied", "Secret"),
    ]
    assert all(getattr(e.body, "reason", "") == NO_RECORD for e in envs)
    await k.keeper.settle_start(desired_pods=())  # the log has them now: nothing more
    assert k.log.last_seq() == 2
    assert validate(k.log.read_after(0)).ok
    k.close()


async def test_a_stored_pod_the_desired_state_lacks_is_deleted_at_start(tmp_path: Path) -> None:
    k = Keeper(tmp_path)
    await k.keeper.open()
    await k.keeper.commit(planned(k.store, POD, config_map()), [])
    await k.keeper.settle_start(desired_pods={"uid-web"})
    assert k.store.pod("default", "web") is not None
    await k.keeper.settle_start(desired_pods=())
    assert k.store.pod("default", "web") is None
    last = list(k.log.read_after(0))[-1]
    assert isinstance(last.body, ObjectDeleted) and last.body.reason
    k.close()
