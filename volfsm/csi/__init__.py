"""CSI v1 protocol for volfsm.

``proto/csi.proto`` is volfsm's own wire-compatible description of the CSI v1
Identity and Node services (plus the Controller calls its test driver serves);
``v1`` holds the stubs generated from it by ``scripts/gen_csi.sh``.
"""
