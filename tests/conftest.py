"""Shared fixtures.

``each_hot_path``: run a test once with the hot path and step core in C (``perfsdk._native``) and once in
Python (``perfsdk.hotpath``, ``perfsdk.stepcore``), the two implementations of one algorithm. A module opts in
with ``pytestmark = pytest.mark.usefixtures("each_hot_path")``.
"""

from __future__ import annotations

import pytest

from perfsdk.monitor import load_native


@pytest.fixture(params=["c", "python"])
def each_hot_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c" and load_native() is None:
        pytest.skip("perfsdk._native is not built here (tests/test_native.py fails for that in CI)")
    monkeypatch.setenv("PERFSDK_HOT_PATH", request.param)
    return request.param
