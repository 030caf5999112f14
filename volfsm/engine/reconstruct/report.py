"""The report: what reconstruction found and did, for `/readyz`, `volfsm get` and the log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from volfsm.engine.reconstruct.orphans import Orphan

log = logger.bind(logger_name="volfsm.engine.reconstruct")


@dataclass
class ReconstructionReport:
    """What reconstruction found and did."""

    interrupted: list[str] = field(default_factory=list)
    """Per operation the process died in: "<stream>: <operation> started at seq N"."""
    uncertain: list[str] = field(default_factory=list)
    """Per entry marked Uncertain: "<stream>: <reason>"."""
    reconstructed: int = 0
    """How many of those were found on the node and not in the log."""
    orphans: list[Orphan] = field(default_factory=list)
    duration_s: float = 0.0
    error: str = ""
    """Why reconstruction failed ("" if it did not); the service is then not ready."""

    def summary(self) -> str:
        """The /readyz line's counts: "N uncertain, M orphans"."""
        return f"{len(self.uncertain)} uncertain, {len(self.orphans)} orphans"

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (service status, `volfsm get`)."""
        return {
            "interrupted": list(self.interrupted),
            "uncertain": list(self.uncertain),
            "reconstructed": self.reconstructed,
            "orphans": [o.as_dict() for o in self.orphans],
            "duration_s": round(self.duration_s, 6),
            "error": self.error,
        }

    def log_lines(self) -> None:
        """One service log line per interrupted operation, Uncertain entry and orphan, then
        the summary."""
        for line in self.interrupted:
            log.warning("reconstruction: interrupted operation {}", line)
        for line in self.uncertain:
            log.warning("reconstruction: Uncertain {}", line)
        for orphan in self.orphans:
            log.warning(
                "reconstruction: orphan {}: {} (cleaned up once the desired state is complete"
                " and no pod wants it)",
                orphan.path,
                orphan.why,
            )
        log.info(
            "reconstruction done in {:.3f}s: {} ({} found on the node, {} interrupted)",
            self.duration_s,
            self.summary(),
            self.reconstructed,
            len(self.interrupted),
        )
