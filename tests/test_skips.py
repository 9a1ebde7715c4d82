"""Under CI=true a test whose environment is missing (root, network namespaces, rsync) fails; elsewhere it skips."""

from __future__ import annotations

import pytest

from tests.conftest import skip_or_fail


def test_a_missing_environment_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI"):
        skip_or_fail("the SSH test hosts need root")


def test_a_missing_environment_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        skip_or_fail("the SSH test hosts need root")
