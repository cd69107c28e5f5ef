"""The programs of test_hosts.py again, every message between the spoofed hosts encoded and decoded in the MPI
wire format (spmdsim.hosts.wire): the format carries every kind of message the protocol sends (steps, collectives,
nested calls, vectorized exchanges, errors, results) and the runs give the same results and reports."""
import pytest

from spmdsim.hosts import transport

from test_hosts import *  # noqa: F401,F403 - the same tests, collected here under the wire format


@pytest.fixture(autouse=True)
def _through_the_wire(monkeypatch):
    monkeypatch.setattr(transport.Fabric, "wire", True)


# -- the format itself ---------------------------------------------------------------------------------------

import json  # noqa: E402
import re  # noqa: E402
import struct  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import spmdsim  # noqa: E402
from spmdsim import errors, lax  # noqa: E402
from spmdsim.runtime._axes import Unnamed  # noqa: E402
from spmdsim.runtime._reports import Signature  # noqa: E402
from spmdsim.hosts import wire  # noqa: E402
from spmdsim.hosts.messages import CallDesc  # noqa: E402


def test_every_field_of_a_collectives_message_travels_as_itself():
    sig = Signature("psum", ("i",), (4,), (("axis_index_groups", ((0, 1), (2, 3))),),
                    (((4,), np.dtype(np.float32)), ((2, 1), np.dtype(ml_dtypes.bfloat16))))
    leaves = [np.arange(4, dtype=np.float32), np.ones((2, 3), ml_dtypes.bfloat16)[:, ::2], np.float64(2.5),
              np.array([b"ab"]), np.array([1 + 2j], np.complex64), np.zeros((0, 3), np.int8), np.array(True)]
    message = ("arrive", 3, (5, 0, 1), ("i",), sig, "f.py:1", "pmean", leaves, lax._mean_of, "printed\n")
    got = wire.check(wire.decode(wire.encode(message)))
    assert got[:7] == message[:7] and got[8] is lax._mean_of and got[9] == "printed\n"
    assert type(got[4]) is Signature and got[4].avals[1][1] == np.dtype(ml_dtypes.bfloat16)
    for a, b in zip(got[7], leaves, strict=True):
        assert type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b)
        assert np.asarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    desc = CallDesc("map", (("i", 4),), "threads", "x.py:3")
    assert wire.roundtrip(("call", 0, desc, ("value", {"x": [1, 2.5, None, "s", (1, 2)], 3: b"\x00"}))) == \
        ("call", 0, desc, ("value", {"x": [1, 2.5, None, "s", (1, 2)], 3: b"\x00"}))
    (axis, size), = wire.roundtrip(((Unnamed("vmap"), 3),))
    assert isinstance(axis, Unnamed) and axis.api == "vmap" and size == 3


class MyError(ValueError):
    pass


def test_errors_travel_as_their_class_from_the_allow_list_with_notes_and_device_errors():
    e = errors.CollectiveDeadlockError("never completes", ["row 1", "row 2"])
    e.add_note("spmdsim: raised on host 1 device 3 [i=3].")
    e.device_errors = {"device 3": e, "device 2": KeyError("k")}
    got = wire.roundtrip(e)
    assert type(got) is errors.CollectiveDeadlockError and str(got) == "never completes"
    assert got.devices == ["row 1", "row 2"] and got.__notes__ == e.__notes__
    assert got.device_errors["device 3"] is got and repr(got.device_errors["device 2"]) == "KeyError('k')"
    assert type(wire.roundtrip(np.exceptions.AxisError("axis 3"))) is np.exceptions.AxisError
    # a class that is not on the list: a RemoteError naming it, still caught by `except ValueError`
    got = wire.roundtrip(MyError("custom"))
    assert isinstance(got, errors.RemoteError) and isinstance(got, ValueError) and not isinstance(got, MyError)
    assert str(got) == "MyError: custom" and got.remote_type == f"{__name__}.MyError"


def test_what_cannot_travel_is_a_type_error_on_the_sending_side():
    for value in (object(), np.array([object()]), lambda: 1, np.zeros(2, [("a", "f4")])):
        with pytest.raises(TypeError, match="cannot travel between hosts"):
            wire.encode(("result", 0, (0,), [value]))

    def returns_an_object():
        return object()

    with pytest.raises(errors.RemoteError, match=r"the program's result \(object\) cannot travel between hosts"):
        spmdsim.run_hosts(2, returns_an_object)


def _message(doc: dict, data: bytes = b"") -> np.ndarray:
    text = json.dumps(doc).encode()
    start = -(-(wire.HEADER.size + len(text)) // 16) * 16
    raw = text + b"\0" * (start - wire.HEADER.size - len(text)) + data
    return np.frombuffer(struct.pack("<4sIQQ", b"SPMD", 1, len(text), wire.HEADER.size + len(raw)) + raw, np.uint8)


@pytest.mark.parametrize("raw, reason", [
    (b"", "shorter than the 24-byte header"),
    (b"cos\nsystem\n(S'echo hacked'\ntR.", "does not start with b'SPMD'"),
    (b"SPMD" + b"\x02\0\0\0" + bytes(16), "format version 2"),
    (_message({"m": {"a": ["|O8", [1], 0]}}, bytes(16)).tobytes(), "unknown dtype '|O8'"),
    (_message({"m": {"a": ["<f8", [1000], 0]}}, bytes(16)).tobytes(), "runs past the end of the message"),
    (_message({"m": {"t": ["arrive", 0]}}).tobytes(), "'arrive' message with 1 fields"),
    (_message({"m": {"t": ["exec", 0]}}).tobytes(), "unknown message kind 'exec'"),
    (_message({"m": {"n": ["os.system", ["ls"]]}}).tobytes(), "unknown record 'os.system'"),
    (_message({"m": {"f": "os.system"}}).tobytes(), "unknown function 'os.system'"),
    (_message({"m": {"t": ["outcome", 0, {"x": 0}]},
               "x": [{"cls": "builtins.ValueError", "bases": [], "text": "", "args": {"t": []},
                      "attrs": {"d": [["__class__", 1]]}}]}).tobytes(), "an exception attribute named '__class__'"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_malformed_messages_are_refused_before_anything_runs(raw, reason):
    with pytest.raises(wire.Malformed, match=re.escape(reason)):
        wire.check(wire.decode(np.frombuffer(raw, np.uint8)))

