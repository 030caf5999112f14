"""load_objects: files, directories, stdin, text; multi-document YAML, JSON lists, kind: List."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.desired.builders import pod, pv, pvc
from volfsm.desired import LoadError, load_objects, parse_objects

MULTI = """\
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-data}
spec:
  csi: {driver: hostpath.csi.example.com, volumeHandle: vol-1}
  capacity: {storage: 1e9}
---
# an empty document is skipped
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  uid: uid-web
  creationTimestamp: 2024-05-01T10:00:00Z
spec:
  volumes:
  - name: scratch
    emptyDir: {}
"""


def test_multi_document_yaml_text() -> None:
    objects = load_objects(MULTI)
    assert [o["kind"] for o in objects] == ["PersistentVolume", "Pod"]
    # Numbers as kubectl reads them (go-yaml: 1e9 is a number); timestamps stay strings.
    assert objects[0]["spec"]["capacity"]["storage"] == 1e9
    assert objects[1]["metadata"]["creationTimestamp"] == "2024-05-01T10:00:00Z"
    json.dumps(objects)


def test_file(tmp_path: Path) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(MULTI)
    assert [o["kind"] for o in load_objects(path)] == ["PersistentVolume", "Pod"]
    assert [o["kind"] for o in load_objects(str(path))] == ["PersistentVolume", "Pod"]


def test_directory_is_read_in_name_order_and_filtered(tmp_path: Path) -> None:
    (tmp_path / "b-pvc.yml").write_text(json.dumps(pvc()))
    (tmp_path / "a-pv.json").write_text(json.dumps(pv()))
    (tmp_path / "c-pod.yaml").write_text(json.dumps(pod()))
    (tmp_path / "README.md").write_text("not: objects")
    (tmp_path / "sub.yaml").mkdir()
    kinds = [o["kind"] for o in load_objects(tmp_path)]
    assert kinds == ["PersistentVolume", "PersistentVolumeClaim", "Pod"]


def test_stdin() -> None:
    stream = io.StringIO(json.dumps([pv(), pvc()]))
    assert [o["kind"] for o in load_objects("-", stdin=stream)] == [
        "PersistentVolume",
        "PersistentVolumeClaim",
    ]


def test_json_list_and_kind_list(tmp_path: Path) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [pv(), pvc()]}
    path = tmp_path / "all.json"
    path.write_text(json.dumps([listed, pod()]))
    objects = load_objects(path)
    assert [o["kind"] for o in objects] == ["PersistentVolume", "PersistentVolumeClaim", "Pod"]
    yaml_list = "kind: List\nitems:\n- " + json.dumps(pv()) + "\n- " + json.dumps(pvc()) + "\n"
    assert [o["kind"] for o in parse_objects(yaml_list)] == [
        "PersistentVolume",
        "PersistentVolumeClaim",
    ]


def test_bad_yaml_names_file_and_document(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("kind: Pod\n---\nkind: Pod\n---\nmetadata: [unclosed\n")
    with pytest.raises(LoadError) as info:
        load_objects(path)
    err = info.value
    assert (err.origin, err.document) == (str(path), 2)
    assert str(err).startswith(f"{path}: document 2: invalid YAML at line 6")


def test_bad_json_file_names_the_position(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"kind": "Pod",\n  "metadata": }')
    with pytest.raises(LoadError, match=r"broken.json: document 0: invalid JSON at line 2"):
        load_objects(path)


def test_document_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "scalar.yaml"
    path.write_text("kind: Pod\n---\njust a string\n")
    with pytest.raises(LoadError, match=r"scalar.yaml: document 1: expected an object.*str"):
        load_objects(path)
    with pytest.raises(LoadError, match=r"document 0: list\[1\]: expected an object, got int"):
        parse_objects("[{kind: Pod}, 3]", "inline")


def test_missing_file() -> None:
    with pytest.raises(LoadError, match=r"nope\.yaml: no such file or directory"):
        load_objects("/nonexistent/nope.yaml")


def test_loaded_objects_apply() -> None:
    from tests.desired.builders import can_serve
    from volfsm.desired import DesiredStateOfWorld

    dsw = DesiredStateOfWorld(can_serve)
    plan = dsw.plan_apply(load_objects(MULTI))
    assert [str(r) for r in plan.results] == [
        "persistentvolume/pv-data created",
        "pod/default/web created",
    ]


def test_a_key_twice_in_json_is_refused_as_in_yaml(tmp_path: Path) -> None:
    path = tmp_path / "pod.json"
    path.write_text('{"kind": "Pod",\n "metadata": {"name": "a",\n  "name": "b"}}\n')
    with pytest.raises(LoadError) as info:
        load_objects(path)
    assert str(info.value) == (
        f'{path}: document 0: invalid JSON at line 3, column 3: mapping key "name" '
        "already defined at line 2"
    )
    with pytest.raises(LoadError, match=r'mapping key "kind" already defined'):
        parse_objects('[{"kind": "Pod", "kind": "PersistentVolume"}]', "inline")


def test_a_json_file_holding_yaml_is_read_as_yaml(tmp_path: Path) -> None:
    path = tmp_path / "pod.json"
    path.write_text("kind: Pod\nmetadata:\n  name: web\n---\nkind: PersistentVolume\n")
    assert [o["kind"] for o in load_objects(path)] == ["Pod", "PersistentVolume"]
