"""Fake-AWS fixtures for the tests in this folder (tests/conftest.py may import them too: one endpoint either way)."""

from tests.aws.fixture import aws, aws_endpoint  # noqa: F401
