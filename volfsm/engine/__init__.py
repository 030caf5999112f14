"""The volume engine: desired state, reconciler, operation executor (kubelet's VolumeManager).

Modules: `config` (EngineConfig), `pending` (nestedpendingoperations: keys
and backoff), `executor` (runs operations, records their lifecycle),
`operations` (the operation generator: which operation does what, keyed
how), with `opcore` (plugin requests, transitions, error rules), `mounting`
(attach, stage, expand during mount, publish, map) and `teardown` (unmount,
unmap, unstage); `index` (per-volume / per-pod lookups fed by the events),
`reconciler` (kubelet's phases over a dirty set) with `rwop`
(ReadWriteOncePod) and `poddirs` (removing deleted pods' dirs);
`reconstruct` (the start-up check of the log against the node, a package);
`snapshot` / `snapshotter` (engine-state snapshots: restore at start, write
while running) and `splitfold`; `failures` (backoffs carried over a
restart); `waits` (`wait_pod`); `status` (what `pods()` / `volumes()`
report) and `engine` (VolumeEngine, the object the service drives).
"""

from volfsm.engine.config import EngineConfig
from volfsm.engine.engine import ApplyResult, EngineNotRunningError, VolumeEngine
from volfsm.engine.pending import (
    AlreadyPendingError,
    BackoffPolicy,
    ExponentialBackoffError,
    NestedPendingOperations,
    OperationKey,
)
from volfsm.engine.status import OperationStatus, PodStatus, PodVolumeStatus, VolumeStatus
from volfsm.engine.waits import PodWaitTimeoutError

__all__ = [
    "AlreadyPendingError",
    "ApplyResult",
    "BackoffPolicy",
    "EngineConfig",
    "EngineNotRunningError",
    "ExponentialBackoffError",
    "NestedPendingOperations",
    "OperationKey",
    "OperationStatus",
    "PodStatus",
    "PodVolumeStatus",
    "PodWaitTimeoutError",
    "VolumeEngine",
    "VolumeStatus",
]
