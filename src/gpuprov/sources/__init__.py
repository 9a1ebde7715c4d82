"""Facts read from their public sources over HTTPS: PyPI's JSON API and the PyTorch wheel index (torch releases),
NVIDIA's CUDA repository (the Packages index per OS), and, through cloud/, EC2 (instance types). `refresh.py`
turns what they say into the overlays plan/facts.py lays over the shipped snapshot; offline.py downloads what a plan
installs into an offline bundle (`gpuprov bundle --offline`); wheel_lock.py locks torch's wheels with the sha256 the
origin index lists (pip's installation report); installers.py reads uv's and Miniforge's pins from their GitHub
releases. This is the one part that reads the public web; plan/ stays pure, cloud/ keeps the AWS calls.

It sits above cloud/ (for EC2's instance types) and below cli/ only: nothing below reads the web, so `plan` stays
offline and cloud/ needs nothing of sources/. tools/refresh_facts.py writes the same facts into data/*.yaml.
"""
