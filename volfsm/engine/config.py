"""Engine settings: reconcile timing, backoff, timeouts, and when unmounts may start."""

from __future__ import annotations

from dataclasses import dataclass, field

from volfsm.engine.snapshot import SnapshotPolicy


@dataclass(frozen=True)
class EngineConfig:
    """How the volume engine reconciles and runs operations.

    Defaults are the kubelet's (reference §2.1, §3): a 100 ms reconcile
    period, backoff 0.5 s doubling to 2 min 2 s, a 2 minute plugin call
    timeout (the CSI client's) and 10 minutes waiting for attach.
    """

    reconcile_period: float = 0.1
    """Seconds between level-triggered passes over what is left to do (retries)."""

    full_resync_period: float = 10.0
    """Seconds between passes over every volume (belt and braces behind the dirty set)."""

    max_volumes_per_pass: int = 4096
    """Volumes one pass handles before yielding to the event loop; the rest follow at once."""

    backoff_initial: float = 0.5
    """Backoff after an operation's first failure, seconds."""

    backoff_factor: float = 2.0
    """Each further failure multiplies the backoff by this."""

    backoff_max: float = 122.0
    """Backoff cap, seconds (kubelet: 2 min 2 s)."""

    operation_timeout: float | None = 120.0
    """Timeout of each plugin call (stage, publish, ...); None waits forever."""

    wait_for_attach_timeout: float = 600.0
    """How long a mount waits for the volume to be attached before giving up (no state change)."""

    desired_complete: bool = True
    """Whether the desired state is known complete at start (kubelet's readyToUnmount).

    While False nothing is unmounted, unstaged or detached, no pod dir or
    orphan is removed; mounts still run. `VolumeEngine.set_desired_complete()`
    flips it, and so does `desired_grace` running out.
    """

    desired_grace: float | None = None
    """Seconds after start after which the desired state counts as complete even if
    nobody said so; None waits until told. Only matters while `desired_complete` is
    False (`volfsm serve` starts that way, with a 30 s grace by default), and only
    while the log can vouch for the node (see `log_lost`).
    """

    log_lost: str = ""
    """Why the log cannot vouch for what is on the node ("" if it can): it was lost or
    replaced, or the root dir was adopted. Then the grace timer does not apply: only
    `VolumeEngine.set_desired_complete()` (`volfsm apply --complete`) opens the gate.
    Reconstruction finding volumes the log does not know has the same effect."""

    volume_stats_period: float = 0.0
    """Seconds between volume stats gatherings of a pod (kubelet's --volume-stats-agg-period;
    each pod's next one after period * (1 + rand[0,1))); 0 or less: none, the default of
    an engine on its own (`volfsm serve` sets 1 m). See `volfsm.engine.volstats`."""

    volume_stats_jitter: bool = True
    """Spread each pod's gatherings as the kubelet does; tests turn it off."""

    snapshots: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    """When engine-state snapshots are written and whether start uses them."""
