"""Volume engine + CSI plugin + volfsm's CSI driver process, end to end (real gRPC, real mounts)."""
