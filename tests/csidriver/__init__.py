"""Tests of volfsm's CSI driver over real gRPC, with real loop devices and mounts."""
