"""The plan, pure: specs and playbooks, the catalog and stack facts, the resolver, the Plan and its
rendered scripts. No network, no SSH (tests/test_layout.py holds it to that)."""
