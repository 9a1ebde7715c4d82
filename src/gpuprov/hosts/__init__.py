"""SSH to hosts: connections with pinned keys, the bundle runner, bootstrap, verify, check, doctor,
access (ssh/exec/tunnel/sync/monitor), bench. Never calls the cloud or the command line."""
