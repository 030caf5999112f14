"""configMap, secret, downwardAPI and projected volumes: objects from the store as files.

`plugin` (the four plugins), `payload` (what each volume holds), `downward`
(the downward API's values), `tokens` (service-account tokens), `certs` (pod
certificates from a node-local CA), `updates` (object changes and refreshes
become remounts). The files are written by `volfsm.node.atomicwriter`.
"""
