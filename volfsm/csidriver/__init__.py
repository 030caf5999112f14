"""volfsm's own small CSI driver, for tests and first steps on a fresh machine.

Volumes are sparse files under a state directory; NodeStage attaches them as
loop devices, formats ext4 on first use and mounts them; NodePublish binds
them into place. Identity, Node and a few Controller calls are served over a
unix socket; faults can be injected from a control file (``faults.py``) and
every call can be recorded in a call log (``journal.py``). Run it as
``volfsm-csi-driver`` (see ``__main__.py``); it must run as root. Volumes of a
running driver are created, grown and deleted from the shell with
``volfsm-csi-driver create-volume|expand-volume|delete-volume`` (``admin.py``).
"""
