"""SSH to hosts: connections with pinned keys, the bundle runner, bootstrap, verify, check, doctor,
access (ssh/exec/tunnel/sync/monitor), bench. Never calls the cloud or the command line.

Any host, launched or not: remote.py (Fabric/paramiko connections with pinned host keys, hostkeys.py, over the TCP
connection wire.py makes), the facts (detect.py), the per-host plan (planner.py), the runner's protocol (runner.py)
and the rendered bundles kept on disk (bundle_cache.py), bootstrap.py (one exec per host: facts, plan, bundle,
steps, reboots) and its per-host log (hostlog.py), the probes and their judges (verify.py, check.py, gpubench.py),
doctor.py on doctor_facts.py (and doctor_sources.py: each source timed from the host), the site's caching proxy
for a bootstrap (site_cache.py), living on a node (access.py; the system ssh and rsync: sshcli.py), gpuprov's ssh
config (sshconfig.py) and the bounded thread pool (fanout.py). It sits above plan/ (it plans each host it
reaches) and below cluster/ and cloud/, which reach hosts through it only; boto3 never (import-linter's
`hosts-no-cloud`).

offline.py sends an offline bundle to a host before bootstrap's steps (`bootstrap --offline DIR`).
"""
