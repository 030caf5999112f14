"""Start-up refusals: one service per data dir, a log keeps its node name; restarts resume."""

from __future__ import annotations

from tests.service.conftest import MakeServe
from tests.service.helpers import ServeProcess


def exit_of(svc: ServeProcess) -> int:
    svc.start(wait_ready=False)
    assert svc.proc is not None
    return svc.proc.wait(60)


def test_a_second_service_on_the_same_data_dir_is_refused(make_serve: MakeServe) -> None:
    first = make_serve("one").start()
    second = make_serve("two")
    second.data_dir = first.data_dir
    assert exit_of(second) == 1
    assert "another volfsm serve using this data dir" in second.stderr_text()
    assert first.alive()
    assert first.stop() == 0


def test_a_log_keeps_its_node_and_a_restart_resumes(make_serve: MakeServe) -> None:
    first = make_serve("one").start()
    node_file = first.data_dir / "node"
    assert node_file.read_text() == "n1\n"
    assert first.stop() == 0

    other = make_serve("two", node="n2")
    other.data_dir = first.data_dir
    assert exit_of(other) == 1
    assert "is the log of node 'n1', not 'n2': pass --node n1" in other.stderr_text()

    again = make_serve("three")
    again.data_dir = first.data_dir
    again.start()
    assert again.stop() == 0
