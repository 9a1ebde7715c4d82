"""The cloud lifecycle's parts that know no SDK: failover order and refusals, quotas, the local
key, region resolution and teardown. lifecycle.py ties them to a provider and the state store."""
