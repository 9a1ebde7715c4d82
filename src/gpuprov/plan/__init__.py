"""The plan, pure: specs and playbooks, the catalog and stack facts, the resolver, the Plan and its
rendered scripts. No network, no SSH, no cloud SDK (import-linter's `plan-is-pure` contract in pyproject.toml).

A request (flags, playbook YAML, config file) becomes a validated `NodeRequest` (spec.py, inventory.py, config.py);
the catalog (catalog.py, with EC2's answer laid over it when read: a GPU it lacks named by gpu_names.py's table of
NVIDIA names, a type EC2 no longer describes retired; catalog_alibaba.py makes Alibaba Cloud's from
data/catalog-alibaba.yaml, which `plan --cloud alibaba` plans on, plan.py's `catalog_for`) and the stack's facts
(stack.py, read from data/*.yaml with their sources, facts.py laying the refreshed overlays over them) feed the
resolver (pins.py refuses bad pins, compat.py solves GPU x OS x driver x CUDA x torch x Python); plan.py turns it
all into the `Plan`, whose steps render.py renders into a `Bundle` of scripts. The plan `gpuprov plan` prints is the
object `up` and `bootstrap` execute. A node on a CPU-only type (`--cpu N --memory GIB`) is planned by cpu.py: no GPU
stack, torch's CPU wheel (docs/cpu-nodes.md). Where every step downloads from is sources.py's map (config, playbook,
--sources, presets), which the templates read for every URL they fetch; site_cache.py sends every key of it through
a site's caching proxy; offline.py says what a plan downloads, the manifest of an offline bundle that holds it, and
whether a bundle serves a plan (docs/mirrors.md, "No network at all"); wheel_lock.py reads the locks `facts
refresh` made of torch's wheels (version and sha256 each), which a plan whose torch one fits installs with
`--require-hashes`.

Facts are data, each with its source and read date (or `unverified: why`, which reaches the plan: `gpuprov plan`
lists every unverified fact the plan relies on); the modules only reason over them. plan/ sits on the records'
floor (state/) and below every part that acts: hosts/ plans each existing host with it, cloud/ each launched node.
"""
