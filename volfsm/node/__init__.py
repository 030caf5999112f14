"""The node's filesystem: everything volfsm does on disk under the root dir, and nothing else.

`layout` (the kubelet's root-dir layout, paths built from checked components,
symlink-safe creation and removal), `mounts` (/proc/self/mountinfo, mount and
umount), `blockmap` (block volumes: the global map, pod device links, loop
device locks), `dirsonly` (removing directories, never files) and `rootdir`
(the root dir's lock and ownership mark).
"""
