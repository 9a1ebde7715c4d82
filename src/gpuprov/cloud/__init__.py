"""Machines from a cloud: what every launch shares (launch.py), one node (node.py), a cluster (cluster_up.py),
reaching a launched node (contact.py), stop/start (stopstart.py), images, teardown and gc, guard changes on
a live node, EC2's consistency rules (settle.py); providers/ holds the small provider protocol and AWS."""
