"""Generated CSI v1 stubs (protobuf messages and gRPC services).

Do not edit: regenerate with scripts/gen_csi.sh from volfsm/csi/proto/csi.proto.
"""
