"""Machines from a cloud: what every launch shares (launch.py), one node (node.py), a cluster (cluster_up.py),
reaching a launched node (contact.py), stop/start (stopstart.py), images, the one destroy gate (destroy.py),
teardown and gc, guard changes on a live node, EC2's consistency rules (settle.py); providers/ holds the core
protocol every cloud implements, the capabilities some declare (asked for through `providers.capabilities.need`),
the registry `--cloud` picks from, and AWS. A node records its cloud; every command on a node asks that cloud.

Also: bake.py (`image bake`), keys.py (the user's key and the region's key pair), own_network.py (gpuprov's own
network where a region or zone has no default one, shared and released as the key pair is), stop_role.py (the
role a node's guards stop it with, on a cloud that needs one: shared by the owner's nodes of every region, released
with the last of them), addresses.py (a
cluster's static addresses, counted against the cloud's quota), instance_store.py (what `stop` loses), tags.py (the
owner), timeline.py, failover.py, waiting.py (`up --wait`), reservations.py and capacity.py, move.py and
move_region.py (`start --move`) with journal.py (the next command finishing or undoing a killed move), stale.py
(`gc --stopped-for`), data.py and data_save.py (a node's S3 access, `down` saving a playbook's data first),
quotas.py, region.py (a region and where it came from; AWS's chain is providers/aws_region.py),
instance_facts.py (EC2's instance types), and team state's use cases (team.py, team_keys.py, adopt.py).

The part sits above cluster/ and hosts/, which it reaches hosts through (no fabric or paramiko here), and below
sources/, which it never imports: the EC2 reads stay here, and `plan --live` and `up` use them on their own.
providers/ knows nothing of the records or SSH; everything above it records each resource before asking a
provider to create it (state/: the money rule).
"""
