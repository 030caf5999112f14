"""volfsm's own small CSI driver, for tests and first steps on a fresh machine.

Volumes are sparse files under a state directory; NodeStage attaches them as
loop devices, formats ext4 on first use and mounts them; NodePublish binds
them into place. Identity, Node and a few Controller calls are served over a
unix socket; faults can be injected from a control file. Run it as
``volfsm-csi-driver`` (see ``__main__.py``); it must run as root.
"""
