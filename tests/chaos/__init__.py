"""The randomized test (issue 35 §7): a stateful walk of real `gpuprov` commands, faults, signals and two members at
once, with the safety invariants checked against the endpoint's own ground truth after every step.

`world.py` is the harness (the members, the commands, what the cloud and the records hold, the invariants), on AWS
(moto) or, through `ecs.py`, on Alibaba Cloud (the ECS imitation);
`test_chaos.py` is the Hypothesis state machine that drives it, a bounded walk for `make test` and the long one
`make chaos SEED=… STEPS=…` runs.
"""
