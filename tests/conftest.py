import threading

import pytest

import spmdsim


@pytest.fixture(autouse=True)
def eight_devices():
    """Every test starts with 8 virtual devices and must leave no spmdsim thread behind."""
    with spmdsim.set_device_count(8):
        yield
    leftover = [t.name for t in threading.enumerate() if t.name.startswith("spmdsim")]
    assert not leftover, f"threads outlived the call: {leftover}"
