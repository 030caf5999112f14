"""Manifests as kubectl reads them: YAML scalars, real documentation shapes, the new kinds,
skipped kinds, uids given at apply, and every problem of a pod reported at once."""

from __future__ import annotations

import base64
import textwrap
import uuid

import pytest

from events.types import PodAdded
from tests.desired.builders import Recorder, can_serve
from volfsm.desired import DesiredStateOfWorld, InvalidObjectError, LoadError, parse_objects
from volfsm.desired.errors import InvalidObjectsError
from volfsm.desired.kinds import ConfigMap
from volfsm.desired.objects import Pod, decode_object


def one(text: str) -> dict[str, object]:
    [obj] = parse_objects(textwrap.dedent(text))
    return obj


# ------------------------------------------------------------------ scalars


def test_yaml_11_booleans_are_strings_where_strings_are_wanted() -> None:
    obj = one(
        """
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: flags}
        data:
          enabled: yes
          debug: no
          feature: on
          legacy: off
          answer: y
          quoted: "true"
        """
    )
    cm = decode_object(obj, "objects[0]")
    assert isinstance(cm, ConfigMap)
    assert cm.data == {
        "enabled": "yes",
        "debug": "no",
        "feature": "on",
        "legacy": "off",
        "answer": "y",
        "quoted": "true",
    }


def test_yaml_11_booleans_are_booleans_where_booleans_are_wanted() -> None:
    # kubectl (go-yaml v2) sends `readOnly: yes` as true, and the API server takes it
    obj = one(
        """
        apiVersion: v1
        kind: Pod
        metadata: {name: web}
        spec:
          volumes:
          - name: data
            persistentVolumeClaim: {claimName: data, readOnly: yes}
          - name: conf
            configMap: {name: app, optional: On}
        """
    )
    pod = decode_object(obj, "objects[0]")
    assert isinstance(pod, Pod)
    claim, conf = pod.spec.volumes
    assert claim.persistent_volume_claim is not None
    assert claim.persistent_volume_claim.read_only is True
    assert conf.config_map is not None and conf.config_map.optional is True


def test_octal_modes_as_kubectl_reads_them() -> None:
    obj = one(
        """
        apiVersion: v1
        kind: Pod
        metadata: {name: web}
        spec:
          volumes:
          - name: conf
            configMap:
              name: app
              defaultMode: 0644
              items:
              - {key: a, path: a, mode: 0o400}
              - {key: b, path: b, mode: 0755}
              - {key: c, path: c, mode: 420}
        """
    )
    pod = decode_object(obj, "objects[0]")
    assert isinstance(pod, Pod)
    source = pod.spec.volumes[0].config_map
    assert source is not None and source.default_mode == 0o644 == 420
    assert [item.mode for item in source.items] == [0o400, 0o755, 420]


def test_other_scalars_keys_nulls_and_escapes() -> None:
    obj = one(
        r"""
        kind: ConfigMap
        metadata: {name: misc, creationTimestamp: 2024-05-01T10:00:00Z}
        data:
          time: 1:30
          escaped: "tab\there \u00e9\x41 \/slash"
          empty:
          on: key-on
          8080: numeric-key
          literal: |
            line one
            line two
        """
    )
    assert obj["metadata"] == {"name": "misc", "creationTimestamp": "2024-05-01T10:00:00Z"}
    cm = decode_object(obj, "objects[0]")
    assert isinstance(cm, ConfigMap)
    assert cm.data == {
        "time": "1:30",  # no YAML 1.1 base-60 number
        "escaped": "tab\there \u00e9A /slash",
        "empty": "",  # a null in a string map is "" (as the API server decodes it)
        "on": "key-on",  # a plain key is its text
        "8080": "numeric-key",
        "literal": "line one\nline two\n",
    }
    numbers = one("a: 1e3\nb: 0x1F\nc: 1_000\nd: -0b101\ne: .5\nf: 08\n")
    assert numbers == {"a": 1000.0, "b": 31, "c": 1000, "d": -5, "e": 0.5, "f": 8.0}


def test_a_number_or_boolean_in_a_string_field_is_refused_as_kubectl_refuses_it() -> None:
    obj = one("kind: ConfigMap\nmetadata: {name: a}\ndata: {port: 8080}\n")
    with pytest.raises(InvalidObjectError) as info:
        decode_object(obj, "objects[0]")
    assert str(info.value) == "ConfigMap default/a: data[...]: Expected `str`, got `int`"


def test_binary_tags_are_refused() -> None:
    with pytest.raises(LoadError) as info:
        parse_objects("kind: ConfigMap\nbinaryData: {a: !!binary aGk=}\n")
    assert "!!binary is not supported" in str(info.value)


def test_a_key_written_twice_is_refused_as_kubectl_refuses_it() -> None:
    # kubectl: `yaml: unmarshal errors: line 9: mapping key "volumes" already defined at
    # line 6`; silently taking the last would drop the first list of volumes
    text = textwrap.dedent(
        """\
        apiVersion: v1
        kind: Pod
        metadata: {name: twice}
        spec:
          containers: [{name: c, image: x}]
          volumes:
          - {name: a, emptyDir: {}}
          nodeName: n1
          "volumes":
          - {name: b, emptyDir: {}}
        """
    )
    with pytest.raises(LoadError) as info:
        parse_objects(text, "pod.yaml")
    assert str(info.value) == (
        'pod.yaml: document 0: invalid YAML at line 9, column 3: mapping key "volumes" '
        "already defined at line 6"
    )


def test_a_key_a_merge_brought_may_be_overridden() -> None:
    obj = one(
        """
        kind: ConfigMap
        base: &base {name: cfg, defaultMode: 0644, optional: true}
        again:
          <<: *base
          defaultMode: 420
        both:
          <<: [{a: 1, b: 1}, {a: 2, c: 2}]
          c: 3
        """
    )
    assert obj["again"] == {"name": "cfg", "defaultMode": 420, "optional": True}
    assert obj["both"] == {"a": 1, "b": 1, "c": 3}


# ------------------------------------------------- a documentation manifest

DOCS = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: nginx-deployment
  labels:
    app: nginx
spec:
  replicas: 3
  selector:
    matchLabels:
      app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: nginx:1.14.2
        ports:
        - containerPort: 80
---
apiVersion: v1
kind: Service
metadata:
  name: my-service
spec:
  selector:
    app.kubernetes.io/name: MyApp
  ports:
    - protocol: TCP
      port: 80
      targetPort: 9376
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: game-demo
data:
  # property-like keys; each key maps to a simple value
  player_initial_lives: "3"
  ui_properties_file_name: "user-interface.properties"

  # file-like keys
  game.properties: |
    enemy.types=aliens,monsters
    player.maximum-lives=5
  user-interface.properties: |
    color.good=purple
    color.bad=yellow
    allow.textmode=true
---
apiVersion: v1
kind: Secret
metadata:
  name: secret-basic-auth
type: kubernetes.io/basic-auth
stringData:
  username: admin
  password: t0p-Secret
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: build-robot
automountServiceAccountToken: false
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: mycsidriver.example.com
spec:
  attachRequired: true
  podInfoOnMount: true
  fsGroupPolicy: File
  volumeLifecycleModes:
    - Persistent
    - Ephemeral
  tokenRequests:
    - audience: "gcp"
    - audience: ""
      expirationSeconds: 3600
  requiresRepublish: true
  seLinuxMount: true
---
apiVersion: v1
kind: Pod
metadata:
  name: test-pd
spec:
  containers:
  - image: registry.k8s.io/test-webserver
    name: test-container
    volumeMounts:
    - mountPath: /cache
      name: cache-volume
  volumes:
  - name: cache-volume
    emptyDir:
      sizeLimit: 500Mi
"""


def test_a_documentation_manifest_applies_and_skips_what_a_node_does_not_run() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    plan = Recorder(dsw).apply(*parse_objects(DOCS))
    assert [str(s) for s in plan.skipped] == [
        "deployment.apps/nginx-deployment skipped: a node does not run Deployment objects "
        "(apps/v1)",
        "service/my-service skipped: a node does not run Service objects (v1)",
    ]
    assert [str(r) for r in plan.results] == [
        "configmap/default/game-demo created",
        "secret/default/secret-basic-auth created",
        "serviceaccount/default/build-robot created",
        "csidriver/mycsidriver.example.com created",
        "pod/default/test-pd created",
    ]
    pod_result = plan.results[-1]
    assert str(uuid.UUID(pod_result.uid)) == pod_result.uid
    [added] = [c.body for c in plan.changes]
    assert isinstance(added, PodAdded) and added.pod_uid == pod_result.uid
    stored = {a.kind: a.raw for a in plan.objects}
    assert stored["Secret"]["data"] == {
        "password": base64.b64encode(b"t0p-Secret").decode(),
        "username": base64.b64encode(b"admin").decode(),
    }
    assert "stringData" not in stored["Secret"]
    assert stored["ConfigMap"]["metadata"]["namespace"] == "default"
    assert "namespace" not in stored["CSIDriver"]["metadata"]


def test_a_pod_keeps_its_uid_when_applied_again_while_it_exists() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    rec = Recorder(dsw)
    pod = next(o for o in parse_objects(DOCS) if o["kind"] == "Pod")
    first = rec.apply(pod).results[0]
    again = dsw.plan_apply([pod]).results[0]
    assert (again.uid, again.action) == (first.uid, "unchanged")
    rec.record(dsw.plan_delete_pod(uid=first.uid))
    later = dsw.plan_apply([pod]).results[0]
    assert later.action == "created" and later.uid != first.uid


KUBE_API_ACCESS = """\
apiVersion: v1
kind: Pod
metadata:
  name: app
  namespace: shop
spec:
  serviceAccountName: build-robot
  securityContext: {fsGroup: 2000}
  containers:
  - name: app
    image: busybox
    resources:
      limits: {cpu: 500m, memory: 128Mi}
  volumes:
  - name: kube-api-access-x7k2p
    projected:
      defaultMode: 420
      sources:
      - serviceAccountToken:
          expirationSeconds: 3607
          path: token
      - configMap:
          name: kube-root-ca.crt
          items:
          - key: ca.crt
            path: ca.crt
      - downwardAPI:
          items:
          - path: namespace
            fieldRef:
              apiVersion: v1
              fieldPath: metadata.namespace
      - clusterTrustBundle:
          signerName: example.com/ca
          labelSelector: {matchLabels: {tier: gold}}
          path: bundle.pem
      - podCertificate:
          signerName: example.com/pods
          keyType: ED25519
          credentialBundlePath: credentials.pem
  - name: podinfo
    downwardAPI:
      items:
      - path: labels
        fieldRef: {fieldPath: metadata.labels}
      - path: cpu_limit
        resourceFieldRef: {containerName: app, resource: limits.cpu, divisor: 1m}
  - name: creds
    secret: {secretName: db, defaultMode: 0400, optional: true}
  - name: host
    hostPath: {path: /var/log, type: Directory}
"""


def test_every_volume_source_of_a_real_pod_is_parsed_and_the_unserved_named_at_once() -> None:
    pod = decode_object(parse_objects(KUBE_API_ACCESS)[0], "objects[0]")
    assert isinstance(pod, Pod)
    assert pod.spec.account == "build-robot"
    assert pod.spec.security_context is not None and pod.spec.security_context.fs_group == 2000
    projected = pod.spec.volumes[0].projected
    assert projected is not None
    assert [s.sources() for s in projected.sources] == [
        ["serviceAccountToken"],
        ["configMap"],
        ["downwardAPI"],
        ["clusterTrustBundle"],
        ["podCertificate"],
    ]
    with pytest.raises(InvalidObjectError) as info:
        DesiredStateOfWorld(can_serve).plan_apply(parse_objects(KUBE_API_ACCESS))
    assert str(info.value) == (
        "Pod shop/app: spec.volumes: no volume plugin on this node serves "
        "kube-api-access-x7k2p (projected), podinfo (downwardAPI), creds (secret), "
        "host (hostPath)"
    )


def test_every_problem_of_a_pod_is_reported_at_once() -> None:
    bad = """\
    apiVersion: v1
    kind: Pod
    metadata: {name: Bad_Name}
    spec:
      volumes:
      - name: a
        configMap: {name: app, defaultMode: 01000, items: [{key: k, path: ../escape}]}
      - name: a
        emptyDir: {sizeLimit: lots}
      - name: c
        projected:
          sources:
          - serviceAccountToken: {path: token, expirationSeconds: 60}
          - downwardAPI: {items: [{path: x, fieldRef: {fieldPath: spec.nodeName}}]}
      - name: d
        persistentVolumeClaim: {claimName: missing}
      - name: e
        nfs: {server: s}
      - name: f
        secret: {secretName: db}
    """
    with pytest.raises(InvalidObjectsError) as info:
        DesiredStateOfWorld(can_serve).plan_apply(parse_objects(textwrap.dedent(bad)))
    lines = str(info.value).splitlines()
    assert all(line.startswith("Pod default/Bad_Name: ") for line in lines)
    assert [line.removeprefix("Pod default/Bad_Name: ") for line in lines] == [
        "spec.volumes[4].nfs.path: required field is missing",
        "metadata.name: 'Bad_Name' must be a DNS-1123 subdomain: lower-case letters, digits, "
        "'-' and '.', starting and ending with a letter or digit",
        "spec.volumes[0].configMap.items[0].path: must not contain '..'",
        "spec.volumes[0].configMap.defaultMode: must be a number between 0 and 0777 (octal), "
        "both inclusive; got 0o1000 (512)",
        "spec.volumes[1].name: duplicate volume name 'a' (also spec.volumes[0])",
        "spec.volumes[1].emptyDir.sizeLimit: invalid quantity 'lots' (expected a number with "
        "an optional suffix: Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent like e9)",
        "spec.volumes[2].projected.sources[0].serviceAccountToken.expirationSeconds: may not "
        "specify a duration less than 10 minutes",
        "spec.volumes[2].projected.sources[1].downwardAPI.items[0].fieldRef.fieldPath: "
        "'spec.nodeName' is not a field a volume can project (supported: "
        "metadata.annotations, metadata.labels, metadata.name, metadata.namespace, "
        "metadata.uid, metadata.labels['KEY'], metadata.annotations['KEY'])",
        "spec.volumes: no volume plugin on this node serves f (secret)",
    ]
    assert info.value.problems[0].field == "Pod default/Bad_Name: spec.volumes[4].nfs.path"


def test_problems_of_several_objects_are_all_reported() -> None:
    objects = parse_objects(
        textwrap.dedent(
            """\
            apiVersion: v1
            kind: Secret
            metadata: {name: db}
            data: {password: "not base64!", "bad key": YQ==}
            ---
            apiVersion: certificates.k8s.io/v1beta1
            kind: ClusterTrustBundle
            metadata: {name: wrong-prefix}
            spec: {signerName: example.com/ca, trustBundle: "no pem here"}
            ---
            apiVersion: storage.k8s.io/v1
            kind: CSIDriver
            metadata: {name: csi.example.com}
            spec: {tokenRequests: [{audience: a, expirationSeconds: 10}, {audience: a}]}
            """
        )
    )
    with pytest.raises(InvalidObjectsError) as info:
        DesiredStateOfWorld(can_serve).plan_apply(objects)
    assert str(info.value).splitlines() == [
        "Secret default/db: data[bad key]: 'bad key' may contain only letters, digits, "
        "'-', '_' and '.'",
        "Secret default/db: data[password]: is not valid base64",
        "ClusterTrustBundle wrong-prefix: metadata.name: must start with 'example.com:ca:' "
        "(the signer name with '/' as ':')",
        "ClusterTrustBundle wrong-prefix: spec.trustBundle: must contain at least one PEM "
        "CERTIFICATE block",
        "CSIDriver csi.example.com: spec.tokenRequests[0].expirationSeconds: must be between "
        "600 and 2^32 seconds",
        "CSIDriver csi.example.com: spec.tokenRequests[1].audience: duplicate audience 'a'",
    ]
    assert "not base64!" not in str(info.value)
