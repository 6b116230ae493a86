"""The machine's bandwidth and FLOP/s, which every speed prediction starts from: read when the machine is quiet,
the best of a few reads kept, a busy read tried again later, measured afresh when the learned factors drift far from
1 (inference/hardware/measurements.py, load.py). Fake reads and a fake load: nothing here times this machine."""

from __future__ import annotations

import json

import pytest

from redline.inference.hardware import load, measurements
from redline.inference.speed import calibration as cal_mod
from redline.inference.speed.calibration import SpeedCalibration


class Machine:
    """A fake machine: what each read measures, and the share of the cores other programs use meanwhile."""

    def __init__(self, monkeypatch, reads: list[float], shares: list[float]):
        self.reads, self.shares, self.calls = list(reads), list(shares), 0
        self.now_share = 0.0  # what a look before a retry sees
        monkeypatch.setattr(load.CpuLoad, "others_share", lambda watch: self.shares.pop(0))
        monkeypatch.setattr(measurements, "others_share_now", lambda interval_s=0.3: self.now_share)

    def measure(self, device: str) -> float:
        self.calls += 1
        return self.reads.pop(0)

    def figure(self, refresh: bool = False) -> float:
        return measurements.measured("bandwidth", "bytes_per_s", "cpu", self.measure, refresh)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _later(cache, seconds: float) -> None:
    """As if the last try were ``seconds`` ago."""
    path = cache / "bandwidth.json"
    data = json.loads(path.read_text())
    for entry in data.values():
        entry["tried_at"] -= seconds
    path.write_text(json.dumps(data))


def test_a_read_taken_while_the_machine_was_busy_is_tried_again_when_it_is_quiet(monkeypatch, cache):
    m = Machine(monkeypatch, reads=[12.5e9, 21e9, 19e9], shares=[0.6, 0.02, 0.03])
    assert m.figure() == 12.5e9 and m.calls == 1  # the first read is needed, busy or not
    assert m.figure() == 12.5e9 and m.calls == 1  # tried again only after RETRY_S
    _later(cache, measurements.RETRY_S)
    m.now_share = 0.5  # still busy: not read, tried again later
    assert m.figure() == 12.5e9 and m.calls == 1
    _later(cache, measurements.RETRY_S)
    m.now_share = 0.0
    assert m.figure() == 21e9 and m.calls == 2  # quiet: read again, the quiet read kept
    entry = json.loads((cache / "bandwidth.json").read_text())
    [only] = entry.values()
    assert only["quiet"] is True and [r["quiet"] for r in only["reads"]] == [False, True]
    _later(cache, 10 * measurements.RETRY_S)
    assert m.figure() == 21e9 and m.calls == 2  # a quiet read is kept for good
    # Refreshed on purpose (a quiet 19e9): the best of the quiet reads since.
    assert m.figure(refresh=True) == 19e9 and m.calls == 3


def test_an_entry_from_before_reads_were_watched_is_read_again_when_quiet(monkeypatch, cache):
    """A cached figure without a word on the load it was read under (every cache before this change) is read once
    more on a quiet machine, and the better of the two kept."""
    key = measurements.device_key("cpu")
    (cache / "bandwidth.json").write_text(json.dumps({key: {"bytes_per_s": 12.5e9, "measured_at": "2026-01-01"}}))
    m = Machine(monkeypatch, reads=[20.5e9], shares=[0.01])
    assert m.figure() == 20.5e9 and m.calls == 1


def test_drifting_factors_have_the_figures_measured_afresh_once(monkeypatch, cache, tmp_path):
    m = Machine(monkeypatch, reads=[20e9, 9e9], shares=[0.0, 0.0])
    assert m.figure() == 20e9
    cal = SpeedCalibration(tmp_path / "speed.json")
    cal.data = {"devices": {"cpu": {"kv:fp32": [{"decode_ratio": 0.3, "time": i} for i in range(5)]}}}
    assert cal.drift("cpu") == pytest.approx(0.3)
    assert cal_mod.check_drift(cal, "cpu", "cpu")
    assert m.figure() == 9e9 and m.calls == 2  # afresh: the new quiet read, not the best with the old one
    assert not cal_mod.check_drift(cal, "cpu", "cpu")  # not again within DRIFT_RETRY_S
    assert m.figure() == 9e9 and m.calls == 2
    # Factors near 1, or too few quiet records, say nothing about the figures.
    cal.data = {"devices": {"cpu": {"kv:fp32": [{"decode_ratio": 1.3, "time": i} for i in range(9)]}}}
    assert cal.drift("cpu") == pytest.approx(1.3) and not cal_mod.check_drift(cal, "cpu", "cpu")
    cal.data = {"devices": {"cpu": {"kv:fp32": [{"decode_ratio": 5.0, "time": i} for i in range(4)]}}}
    assert cal.drift("cpu") is None


def test_others_share_of_the_cores_leaves_this_process_out(monkeypatch):
    """The machine's busy time minus this process's own over the wall time × the cores: Redline's own threads never
    make the machine look busy (they lift the load average as much as another program would)."""
    monkeypatch.undo()  # the real CpuLoad.others_share, not the suite's quiet machine
    counters = iter([(100.0, 10.0), (103.0, 12.0)])  # 3 busy CPU-seconds in all, 2 of them this process's
    monkeypatch.setattr(load, "_busy_seconds", lambda: next(counters))
    monkeypatch.setattr(load, "cpu_count", lambda: 2)
    clock = iter([50.0, 51.0])  # one second
    monkeypatch.setattr(load.time, "perf_counter", lambda: next(clock))
    assert load.CpuLoad().others_share() == pytest.approx(0.5)  # 1 CPU-second of others' over 2 core-seconds
    assert load.busy(0.5, None) and not load.busy(0.1, 50.0)
    assert load.busy(None, 3.0, cpus=2) and not load.busy(None, 2.0, cpus=2) and not load.busy(None, None)
