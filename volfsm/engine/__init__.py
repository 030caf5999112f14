"""The volume engine: desired state, reconciler, operation executor (kubelet's VolumeManager).

Modules: `config` (EngineConfig), `pending` (nestedpendingoperations: keys
and backoff), `executor` (runs operations, records their lifecycle),
`operations` (what each operation does and which transitions it fires),
`index` (per-volume / per-pod lookups fed by the events), `reconciler`
(kubelet's phases over a dirty set), `status` (what `pods()` / `volumes()`
report) and `engine` (VolumeEngine, the object the service drives).
"""

from volfsm.engine.config import EngineConfig
from volfsm.engine.engine import (
    ApplyResult,
    EngineNotRunningError,
    PodWaitTimeoutError,
    VolumeEngine,
)
from volfsm.engine.pending import (
    AlreadyPendingError,
    BackoffPolicy,
    ExponentialBackoffError,
    NestedPendingOperations,
    OperationKey,
)
from volfsm.engine.status import OperationStatus, PodStatus, PodVolumeStatus, VolumeStatus

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
