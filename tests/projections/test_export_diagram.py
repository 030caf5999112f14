"""ndjson export round trip and the mermaid diagrams generated from the tables."""

from __future__ import annotations

import io
import json

from events.streams import device_stream, podvol_stream
from events.tables import DEVICE_FSM, PODVOL_FSM, TABLES
from events.types import DeviceAttached, OperationFailed, OperationStarted, VolumeMounted
from projections.asw import fold
from projections.diagram import all_diagrams, edges, mermaid
from projections.export import ndjson_lines, read_ndjson, write_ndjson
from tests.projections.builders import History


def _history() -> History:
    h = History()
    dev = device_stream("vol-1")
    h.add(0, dev, OperationStarted(op_id="o1", operation="attach", volume_id="vol-1"))
    h.add(1, dev, DeviceAttached(volume_id="vol-1", plugin="csi", attachable=True))
    h.add(
        2,
        dev,
        OperationFailed(
            op_id="o1", operation="attach", code="Unavailable", message="m", final=False
        ),
    )
    pv = podvol_stream("pod-a", "data")
    h.add(3, pv, VolumeMounted(volume_id="vol-1", pod_uid="pod-a", volume_name="data"))
    return h


def test_ndjson_is_one_public_json_envelope_per_line_and_reads_back() -> None:
    h = _history()
    out = io.BytesIO()
    assert write_ndjson(h.envs, out) == 4
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    first = json.loads(lines[0])
    assert first["seq"] == 1 and first["type"] == "OperationStarted"
    assert first["body"]["type"] == "OperationStarted" and first["body"]["op_id"] == "o1"
    assert list(read_ndjson(out.getvalue().decode().splitlines(keepends=True))) == h.envs
    assert fold(read_ndjson(lines)) == fold(h.envs)
    assert list(ndjson_lines([])) == []


def test_edges_cover_every_source_and_trigger_once() -> None:
    for table in TABLES.values():
        got = {(src, trig) for src, _dest, trig, _ev in edges(table)}
        want = {(src, t.trigger) for t in table.transitions for src in t.sources}
        assert got == want
        assert len(edges(table)) == len(want)


def test_mermaid_text_has_the_initial_arrow_and_every_transition() -> None:
    text = mermaid(DEVICE_FSM)
    lines = text.splitlines()
    assert lines[0] == "stateDiagram-v2"
    assert "    [*] --> Detached" in lines
    assert "    Detached --> Attached: attach / DeviceAttached" in lines
    assert "    Uncertain --> Attached: unmount_device / DeviceUnmounted" in lines
    # A "stay" row is a self-loop.
    assert "    Attached --> Attached: resize / VolumeResized" in lines
    arrows = [line for line in lines if "-->" in line and "[*]" not in line]
    assert len(arrows) == sum(len(t.sources) for t in DEVICE_FSM.transitions)
    pv = mermaid(PODVOL_FSM)
    assert "    [*] --> Unmounted" in pv
    assert "    Uncertain --> Unmounted: unmount / VolumeUnmounted" in pv
    assert set(all_diagrams()) == {"device", "podvol"}
