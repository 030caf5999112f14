"""The CSI volume plugin: drives any CSI v1 node plugin over gRPC on a unix socket."""
