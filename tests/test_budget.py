import os

import budget


def test_bounds_scale_with_the_load_per_core_and_never_shrink(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 0.0, 0.0))
    assert budget.within(1.5) == 4.5
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.0, 0.0))
    assert budget.within(1.5) == 1.5
