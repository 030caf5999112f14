"""Wiring of the configMap, secret, downwardAPI and projected plugins into `volfsm serve`.

`register_object_plugins` registers the four plugins with their token
source (``--token-command`` or the node-local signer, its key in
``<data-dir>/tokens/signer.pem``, 0600), certificate source
(``--cert-command`` or the node-local CA in ``<data-dir>/tokens/ca.pem``)
and node resources
(``--node-allocatable`` over what the node has); `start_updates` hooks
them to the engine's object store once there is one. `admission` is what
applied pods are admitted with (the kube-root-ca.crt bundle: ``--root-ca-file``
or the node-local CA's certificate).
"""

from __future__ import annotations

import asyncio
from fractions import Fraction

from cryptography.hazmat.primitives import serialization

from volfsm.desired.admission import (
    ROOT_CA_CONFIG_MAP,
    ROOT_CA_KEY,
    Admission,
    published_by_volfsm,
    root_ca_config_map,
)
from volfsm.desired.kinds import ConfigMap
from volfsm.desired.quantity import parse_quantity
from volfsm.engine import VolumeEngine
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.objectvol.certs import CertManager, CertSource, CommandCertSource, LocalCA
from volfsm.plugins.objectvol.downward import node_allocatable
from volfsm.plugins.objectvol.plugin import ObjectVolumes, object_plugins
from volfsm.plugins.objectvol.tokens import (
    CommandTokenSource,
    LocalSigner,
    TokenManager,
    TokenSource,
)
from volfsm.plugins.objectvol.updates import ObjectUpdates
from volfsm.service.config import Settings

SIGNER_KEY = "tokens/signer.pem"
CA_KEY = "tokens/ca.pem"


def token_source(s: Settings) -> TokenSource:
    """The token command if one is set, else the node-local signer."""
    if s.token_command:
        return CommandTokenSource(s.token_command)
    return LocalSigner(s.data_dir / SIGNER_KEY, issuer=f"volfsm-node-local:{s.node}")


def cert_source(s: Settings) -> CertSource:
    """The certificate command if one is set, else the node-local CA."""
    if s.cert_command:
        return CommandCertSource(s.cert_command, s.node)
    return LocalCA(s.data_dir / CA_KEY, s.node)


def admission(s: Settings) -> Admission:
    """ServiceAccount admission of applied pods, their kube-root-ca.crt from --root-ca-file,
    else from the node-local CA's certificate (made on first use, trusted by no one else)."""
    if s.root_ca_pem:
        return Admission(s.root_ca_pem, f"--root-ca-file {s.root_ca_file}")
    cert = LocalCA(s.data_dir / CA_KEY, s.node).cert
    return Admission(cert.public_bytes(serialization.Encoding.PEM).decode(), "the node-local CA")


async def refresh_root_ca(engine: VolumeEngine, admission: Admission) -> list[str]:
    """Publish again, with the current bundle, each kube-root-ca.crt ConfigMap volfsm
    published with another (--root-ca-file changed between runs), as the
    root-ca-cert-publisher updates its ConfigMaps; an applied one is never touched. Returns
    the namespaces updated (their mounted ca.crt files are rewritten like any update)."""
    stale = [
        stored.namespace
        for stored in engine.objects.objects("ConfigMap")
        if stored.name == ROOT_CA_CONFIG_MAP
        and isinstance(stored.obj, ConfigMap)
        and published_by_volfsm(stored.obj.metadata.annotations)
        and stored.obj.data.get(ROOT_CA_KEY) != admission.root_ca_pem
    ]
    if stale and admission.root_ca_pem:
        await engine.apply([root_ca_config_map(ns, admission.root_ca_pem) for ns in stale])
    return stale


def register_object_plugins(
    catalog: PluginCatalog, layout: RootLayout, s: Settings
) -> ObjectVolumes:
    """Register the four plugins; what they share (its store is set by `start_updates`)."""
    allocatable: dict[str, Fraction] = node_allocatable(layout.root)
    allocatable.update({k: parse_quantity(v) for k, v in s.node_allocatable.items()})
    shared = ObjectVolumes(
        tokens=TokenManager(token_source(s), max_ttl_s=s.token_max_ttl or None),
        certs=CertManager(cert_source(s)),
        allocatable=allocatable,
    )
    for plugin in object_plugins(layout, shared):
        catalog.register(plugin)
    return shared


def start_updates(engine: VolumeEngine, shared: ObjectVolumes) -> ObjectUpdates:
    """Give the plugins the engine's store and remount on its changes and token refreshes."""
    shared.store = engine.objects
    return ObjectUpdates(engine.objects, engine, shared, asyncio.get_running_loop())
