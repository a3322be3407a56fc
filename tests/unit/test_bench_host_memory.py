"""bench/host_memory.py: free page reporting held off for a measurement, and put back after."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench_scripts import import_bench


@pytest.fixture(scope="module")
def host_memory():
    return import_bench("host_memory")


def test_the_order_is_raised_inside_and_put_back_after(host_memory, tmp_path: Path):
    setting = tmp_path / "page_reporting_order"
    setting.write_text("9\n")
    with host_memory.reporting_held_off(setting) as said:
        assert setting.read_text() == host_memory.HELD_OFF
        assert "held off" in said and "9" in said
    assert setting.read_text() == "9"


def test_it_is_put_back_when_the_measurement_fails(host_memory, tmp_path: Path):
    setting = tmp_path / "page_reporting_order"
    setting.write_text("9")
    with pytest.raises(RuntimeError), host_memory.reporting_held_off(setting):
        raise RuntimeError("a bench round failed")
    assert setting.read_text() == "9"


def test_one_held_off_by_another_measurement_is_left_to_it(host_memory, tmp_path: Path):
    setting = tmp_path / "page_reporting_order"
    setting.write_text(host_memory.HELD_OFF)
    with host_memory.reporting_held_off(setting) as said:
        assert said.endswith("already held off")
    assert setting.read_text() == host_memory.HELD_OFF  # the other measurement puts it back


def test_a_kernel_without_it_and_a_setting_it_may_not_write_are_said(host_memory, tmp_path: Path):
    with host_memory.reporting_held_off(tmp_path / "absent") as said:
        assert "not offered" in said
    readonly = Path("/proc/version")  # readable, never writable, even by root
    with host_memory.reporting_held_off(readonly) as said:
        assert said.startswith("free page reporting: ON") and "not writable" in said
