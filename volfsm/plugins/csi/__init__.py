"""The CSI volume plugin: drives any CSI v1 node plugin over gRPC on a unix socket.

* `plugin` - CsiPlugin, the VolumePlugin (what the kubelet does around the driver);
* `client` - the asyncio gRPC client (deadlines, response checks);
* `errors` - the kubelet's final / non-final error classes;
* `requests` - requests as the kubelet builds them (access-mode mapping, mount group);
* `paths` / `files` - the kubelet's directories and vol_data.json files;
* `construct` - CsiVolumes: volumes read back from those files (reconstruction);
* `verify` - what mountinfo shows after the driver said OK;
* `redact` - messages with every csi_secret field stripped, for logs.
"""
