"""What a message between hosts looks like on the wire (MPI): plain data, never pickle, so that receiving one
runs no code.

A message is one byte buffer: a fixed header (:data:`HEADER`: magic ``b"SPMD"``, format version, the length of
the JSON part, the total length), a JSON document (UTF-8) describing the message, then the raw bytes of its
arrays, each at an offset aligned to 16 bytes (sent and received through mpi4py's buffer interface, no copy on
receipt: the arrays are views of the received buffer). The JSON holds plain values as themselves (None, bool,
int, float, str, lists) and everything else as an object with one tag:

=========  ===============================================================================================
``t``      a tuple: ``{"t": [items]}``
``d``      a dict: ``{"d": [[key, value], ...]}``
``a``      an array: ``{"a": [dtype, shape, offset]}``; ``g``: a NumPy scalar, the same fields
``dt``     a NumPy dtype: its ``str`` (``"<f4"``) for NumPy's numeric, bool, string and time dtypes, or the
           name of an ``ml_dtypes`` type (``"bfloat16"``); never an object or structured dtype
``c``      a complex number ``[re, im]``; ``b``: bytes, as hex
``n``      one of spmdsim's records (:data:`RECORDS`: a step of the hosts, a collective's signature)
``u``      an unnamed map axis (its API's name); ``f``: one of spmdsim's functions (:data:`FUNCTIONS`)
``x``      an exception: an index into the message's table of exceptions (``"x"`` at the top level)
=========  ===============================================================================================

An exception travels as its class's qualified name, its ``args`` and its attributes (notes, ``device_errors``,
a collective error's device table), never its traceback. The receiver makes it again only from a class on an
allow-list (Python's built-in exceptions, :mod:`spmdsim.errors`, NumPy's, those of spmdsim's modules); any
other class arrives as a :class:`~spmdsim.errors.RemoteError` (also an instance of the nearest allow-listed base
class, so that ``except ValueError`` still catches a subclass of ValueError) with the class name in its message.

:func:`decode` raises :class:`Malformed` for anything that is not such a message: the transport reports it as
"malformed message from host N: ..." and the run ends.
"""
from __future__ import annotations

import builtins
import functools
import json
import re
import struct
import sys
import numpy as np

from spmdsim.runtime._axes import Unnamed
from spmdsim.errors import RemoteError

__all__ = ["Malformed", "encode", "decode", "check", "roundtrip", "travels", "HEADER"]

MAGIC = b"SPMD"
VERSION = 1
HEADER = struct.Struct("<4sIQQ")  # magic, version, JSON length, total length
ALIGN = 16


class Malformed(ValueError):
    """Bytes that are not a message of this format (or of a kind the protocol does not know)."""


# -- what may travel -------------------------------------------------------------------------------------

_RECORD_TYPES: dict = {}  # NamedTuple classes the modules that define them declare (messages: CallDesc)


def record_type(cls):
    """Declare the NamedTuple class ``cls`` as one that may travel (by its name). Returns ``cls``."""
    _RECORD_TYPES[cls.__name__] = cls
    if RECORDS:
        RECORDS[cls.__name__] = cls
    return cls


def _records() -> dict:
    from spmdsim.runtime._reports import Signature
    return {"Signature": Signature, **_RECORD_TYPES}


def _functions() -> dict:
    from spmdsim import lax
    return {"spmdsim.lax._mean_of": lax._mean_of}


RECORDS: dict = {}     # name -> NamedTuple class (filled on first use)
FUNCTIONS: dict = {}   # qualified name -> function (filled on first use)
_FUNCTION_NAMES: dict = {}


def _registry() -> None:
    if not FUNCTIONS:
        RECORDS.update(_records())
        FUNCTIONS.update(_functions())
        _FUNCTION_NAMES.update({id(f): name for name, f in FUNCTIONS.items()})


_NUMPY_KINDS = "biufcSUmM"
_DTYPE_STR = re.compile(r"[<>|=][biufcSUmM]\d{1,6}(\[\w{1,3}\])?\Z")


def _ml_dtypes():
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - a dependency of jax; absent only without it
        return None
    return ml_dtypes


@functools.lru_cache(maxsize=256)
def _dtype_text(dtype: np.dtype) -> str:
    if dtype.kind in _NUMPY_KINDS and dtype.type.__module__ == "numpy" and not dtype.hasobject \
            and dtype.names is None and _DTYPE_STR.match(dtype.str):
        return dtype.str
    if _ml_names().get(dtype.name) == dtype:
        return dtype.name
    raise TypeError(f"an array of dtype {dtype} cannot travel between hosts (only NumPy's numeric, bool, string and "
                    f"time dtypes and ml_dtypes' do)")


@functools.lru_cache(maxsize=1)
def _ml_names() -> dict:
    """name -> dtype of ml_dtypes' scalar types (bfloat16, the float8s, int4, ...)."""
    ml, found = _ml_dtypes(), {}
    for name in dir(ml) if ml is not None else ():
        kind = getattr(ml, name)
        if name.startswith("_") or not isinstance(kind, type) or not issubclass(kind, np.generic):
            continue
        dtype = np.dtype(kind)
        if not dtype.hasobject and dtype.names is None and dtype.itemsize <= 16:
            found[dtype.name] = dtype
    return found


def _dtype_of(text) -> np.dtype:
    if not isinstance(text, str):
        raise Malformed(f"a dtype must be a string, got {text!r:.80}")
    return _dtype_named(text)


@functools.lru_cache(maxsize=256)
def _dtype_named(text: str) -> np.dtype:
    if _DTYPE_STR.match(text):
        try:
            dtype = np.dtype(text)
        except TypeError:
            raise Malformed(f"unknown dtype {text!r:.80}") from None
    else:
        dtype = _ml_names().get(text)
        if dtype is None:
            raise Malformed(f"unknown dtype {text!r:.80}")
    if dtype.hasobject or dtype.names is not None:
        raise Malformed(f"dtype {text!r} is not plain data")
    return dtype


# -- exceptions ------------------------------------------------------------------------------------------

def _allowed_classes() -> dict:
    import numpy.exceptions as npx

    from spmdsim import errors
    found = {}
    for name in dir(builtins):
        cls = getattr(builtins, name)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found[f"builtins.{name}"] = cls
    for module in (errors, npx):
        for name in dir(module):
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = cls
    return found


_ALLOWED: dict = {}


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _allowed(name: str):
    """The exception class named ``name`` when it is on the allow-list, else None. Besides the fixed list, a class
    of one of spmdsim's own modules already imported here (never importing anything)."""
    if not _ALLOWED:
        _ALLOWED.update(_allowed_classes())
    cls = _ALLOWED.get(name)
    if cls is not None:
        return cls
    module, _, qualname = name.rpartition(".")
    if (module == "spmdsim" or module.startswith("spmdsim.")) and qualname.isidentifier():
        cls = getattr(sys.modules.get(module), qualname, None)
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == module:
            return cls
    return None


@functools.lru_cache(maxsize=64)
def _remote_class(base: type) -> type:
    """RemoteError, also a ``base`` (the nearest allow-listed base class of a class that may not travel)."""
    if base in (BaseException, Exception) or issubclass(RemoteError, base):
        return RemoteError
    try:
        return type(f"Remote{base.__name__}", (RemoteError, base), {"__module__": "spmdsim.errors"})
    except TypeError:  # incompatible layouts (OSError's)
        return RemoteError


# -- encoding --------------------------------------------------------------------------------------------

class _Encoder:
    __slots__ = ("arrays", "size", "errors", "error_ids")

    def __init__(self, start: int = 0):
        self.arrays: list = []   # (offset, array)
        self.size = start
        self.errors: list = []
        self.error_ids: dict = {}

    def value(self, v):
        t = type(v)
        if t is str or t is int or t is float or v is None or t is bool:
            return v
        if t is tuple:
            return {"t": [self.value(x) for x in v]}
        if t is list:
            return [self.value(x) for x in v]
        if t is np.ndarray:
            return {"a": self.array(v)}
        if t is dict:
            return {"d": [[self.value(k), self.value(x)] for k, x in v.items()]}
        if isinstance(v, np.generic):
            return {"g": self.array(np.asarray(v))}
        if isinstance(v, np.dtype):
            return {"dt": _dtype_text(v)}
        if isinstance(v, BaseException):
            return {"x": self.exception(v)}
        if isinstance(v, tuple) and hasattr(t, "_fields"):
            _registry()
            name = t.__name__
            if RECORDS.get(name) is not t:
                raise TypeError(f"a {name} cannot travel between hosts")
            return {"n": [name, [self.value(x) for x in v]]}
        if isinstance(v, Unnamed):
            return {"u": str(v.api)}
        if t is complex:
            return {"c": [v.real, v.imag]}
        if t is bytes:
            return {"b": v.hex()}
        if isinstance(v, np.ndarray):
            return {"a": self.array(np.asarray(v))}
        if isinstance(v, int):  # subclasses (an IntEnum; NumPy's scalars are np.generic, above)
            return int(v)
        if isinstance(v, float):
            return float(v)
        if isinstance(v, str):
            return str(v)
        if callable(v):
            _registry()
            name = _FUNCTION_NAMES.get(id(v))
            if name is not None:
                return {"f": name}
        raise TypeError(f"a {t.__name__} cannot travel between hosts (only None, bool, int, float, complex, str, "
                        f"bytes, tuples, lists, dicts, NumPy arrays, scalars and dtypes, and exceptions do)")

    def array(self, a: np.ndarray) -> list:
        dtype = _dtype_text(a.dtype)
        offset = -(-self.size // ALIGN) * ALIGN
        self.arrays.append((offset, a))
        self.size = offset + a.nbytes
        return [dtype, list(a.shape), offset]

    def exception(self, e: BaseException) -> int:
        index = self.error_ids.get(id(e))
        if index is not None:
            return index
        index = self.error_ids[id(e)] = len(self.errors)
        self.errors.append(None)
        cls = type(e)
        name = _class_name(cls)
        bases = [_class_name(c) for c in cls.__mro__[1:] if issubclass(c, BaseException)]
        text = _text(e)
        try:
            args = self.value(tuple(e.args))
        except TypeError:  # arguments that cannot travel: made as a RemoteError with its text
            args, name, bases = self.value((text,)), "", [name, *bases]
        attrs = {}
        for key, value in vars(e).items():  # those that can travel (notes, device_errors, devices, ...)
            if _attribute(key):
                try:
                    attrs[key] = self.value(value)
                except TypeError:
                    pass
        attrs = {"d": [[k, v] for k, v in attrs.items()]}
        self.errors[index] = {"cls": name, "bases": bases, "text": text, "args": args, "attrs": attrs}
        return index


def _attribute(name) -> bool:
    """Whether an exception's attribute ``name`` travels: its notes and public or private names, no dunders."""
    return isinstance(name, str) and name.isidentifier() and (name == "__notes__" or not name.startswith("__"))


def _text(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - a broken __str__
        return f"<{type(e).__name__}>"


def encode(message) -> np.ndarray:
    """``message`` as the bytes of one message (a uint8 array). TypeError for a value that cannot travel."""
    enc = _Encoder()
    body = enc.value(message)
    doc = {"m": body}
    if enc.errors:
        doc["x"] = enc.errors
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    start = -(-(HEADER.size + len(text)) // ALIGN) * ALIGN
    total = start + enc.size
    buf = np.empty(total, np.uint8)
    HEADER.pack_into(buf, 0, MAGIC, VERSION, len(text), total)
    buf[HEADER.size:HEADER.size + len(text)] = np.frombuffer(text, np.uint8)
    for offset, a in enc.arrays:
        if a.nbytes:
            at = start + offset
            np.copyto(buf[at:at + a.nbytes].view(a.dtype).reshape(a.shape), a, casting="no")
    return buf


def travels(value) -> None:
    """Raise TypeError when ``value`` cannot travel between hosts (without building the message)."""
    _Encoder().value(value)


# -- decoding --------------------------------------------------------------------------------------------

class _Decoder:
    def __init__(self, buf: np.ndarray, start: int, errors: list):
        self.buf, self.start = buf, start
        self.raw_errors = errors
        self.errors: list = [None] * len(errors)

    def value(self, v):
        t = type(v)
        if t is str or t is int or t is float or v is None or t is bool:
            return v
        if t is list:
            return [self.value(x) for x in v]
        if t is not dict or len(v) != 1:
            raise Malformed(f"unexpected JSON value {v!r:.80}")
        (tag, body), = v.items()
        if tag == "t":
            return tuple(self.value(x) for x in _list(body))
        if tag == "a":
            return self.array(body)
        if tag == "d":
            items = {}
            for pair in _list(body):
                if type(pair) is not list or len(pair) != 2:
                    raise Malformed("a dict entry must be a [key, value] pair")
                key = self.value(pair[0])
                try:
                    items[key] = self.value(pair[1])
                except TypeError:
                    raise Malformed(f"unhashable dict key {key!r:.80}") from None
            return items
        if tag == "g":
            return self.array(body)[()]
        if tag == "dt":
            return _dtype_of(body)
        if tag == "x":
            return self.exception(body)
        if tag == "n":
            _registry()
            name, fields = _list(body, 2)
            record = RECORDS.get(name) if isinstance(name, str) else None
            fields = _list(fields)
            if record is None or len(fields) != len(record._fields):
                raise Malformed(f"unknown record {name!r:.80}")
            return record(*(self.value(x) for x in fields))
        if tag == "u":
            if not isinstance(body, str):
                raise Malformed("an unnamed axis's API must be a string")
            return Unnamed(body)
        if tag == "f":
            _registry()
            if body not in FUNCTIONS:
                raise Malformed(f"unknown function {body!r:.80}")
            return FUNCTIONS[body]
        if tag == "c":
            re_, im = _list(body, 2)
            if not all(type(p) in (int, float) for p in (re_, im)):
                raise Malformed("a complex number is two numbers")
            return complex(re_, im)
        if tag == "b":
            try:
                return bytes.fromhex(body)
            except (TypeError, ValueError):
                raise Malformed("bytes must be hex") from None
        raise Malformed(f"unknown tag {tag!r:.40}")

    def array(self, body) -> np.ndarray:
        dtype, shape, offset = _list(body, 3)
        dtype = _dtype_of(dtype)
        shape = _list(shape)
        if not all(type(s) is int and 0 <= s < 2**48 for s in shape) or type(offset) is not int or offset < 0 \
                or offset % ALIGN:
            raise Malformed(f"bad array record {body!r:.80}")
        count = 1
        for s in shape:
            count *= s
        at = self.start + offset
        end = at + count * dtype.itemsize
        if end > len(self.buf):
            raise Malformed(f"an array of {count * dtype.itemsize} bytes at {offset} runs past the end of the "
                            f"message ({len(self.buf) - self.start} bytes of data)")
        return self.buf[at:end].view(dtype).reshape(shape)

    def exception(self, index):
        if type(index) is not int or not 0 <= index < len(self.errors):
            raise Malformed(f"no exception {index!r:.40} in the message")
        if self.errors[index] is None:
            raw = self.raw_errors[index]
            if type(raw) is not dict or set(raw) != {"cls", "bases", "text", "args", "attrs"}:
                raise Malformed("bad exception record")
            self.errors[index] = error = _made(raw["cls"], _list(raw["bases"]), raw["text"], self.value(raw["args"]))
            attrs = self.value(raw["attrs"])
            if type(attrs) is not dict or not all(type(k) is str for k in attrs):
                raise Malformed("an exception's attributes must be a dict of names")
            for key, value in attrs.items():
                if not _attribute(key):
                    raise Malformed(f"an exception attribute named {key!r:.40}")
                try:
                    setattr(error, key, value)
                except (AttributeError, TypeError, ValueError):
                    pass
            if not all(isinstance(n, str) for n in getattr(error, "__notes__", ())) or \
                    not isinstance(getattr(error, "__notes__", []), list):
                raise Malformed("an exception's notes must be a list of strings")
        return self.errors[index]


def _made(name, bases: list, text, args) -> BaseException:
    if not isinstance(name, str) or not isinstance(text, str) or type(args) is not tuple \
            or not all(isinstance(b, str) for b in bases):
        raise Malformed("bad exception record")
    cls = _allowed(name) if name else None
    if cls is not None:
        try:
            error = cls(*args)
            if isinstance(error, cls):
                return error
        except Exception:  # noqa: BLE001 - arguments its __init__ does not take: made as a RemoteError below
            pass
    base = next((c for c in map(_allowed, bases) if c is not None), Exception)
    shown = (name or (bases[0] if bases else "Exception")).rpartition(".")[2]
    error = _remote_class(base)(f"{shown}: {text}")
    error.remote_type = name or (bases[0] if bases else "")
    return error


def _list(v, n: int | None = None) -> list:
    if type(v) is not list or (n is not None and len(v) != n):
        raise Malformed(f"expected a list{'' if n is None else f' of {n}'}, got {v!r:.80}")
    return v


def decode(buf) -> object:
    """The message in ``buf`` (a uint8 array, as received); Malformed when it is not one."""
    buf = np.asarray(buf, np.uint8).reshape(-1)
    if len(buf) < HEADER.size:
        raise Malformed(f"{len(buf)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, length, total = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise Malformed(f"it does not start with {MAGIC!r} (starts with {bytes(buf[:8])!r})")
    if version != VERSION:
        raise Malformed(f"format version {version}, this host speaks {VERSION}")
    if total != len(buf) or HEADER.size + length > total:
        raise Malformed(f"its header says {total} bytes with {length} of JSON; {len(buf)} arrived")
    try:
        doc = json.loads(buf[HEADER.size:HEADER.size + length].tobytes().decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise Malformed(f"its description is not JSON ({e})") from None
    if type(doc) is not dict or "m" not in doc or not set(doc) <= {"m", "x"}:
        raise Malformed("its description has no message")
    start = -(-(HEADER.size + length) // ALIGN) * ALIGN
    try:
        return _Decoder(buf, start, _list(doc.get("x", []))).value(doc["m"])
    except RecursionError:
        raise Malformed("nested too deeply") from None


# -- the protocol's messages -----------------------------------------------------------------------------

# kind -> (fewest fields, most fields), the kind included; "k": the fields that must be ints
_KINDS = {"call": (4, 4), "answer": (4, 4), "outcome": (3, 3), "vx": (4, None), "exit": (3, 3), "bye": (2, 2),
          "arrive": (10, 10), "nested": (6, 6), "done": (6, 6), "result": (4, 4), "abort": (2, 2),
          "heartbeat": (1, 1)}


def check(message) -> tuple:
    """``message`` when it is a message of the protocol (a known kind, its number of fields, a step number
    where one belongs), else Malformed."""
    if type(message) is not tuple or not message or not isinstance(message[0], str):
        raise Malformed(f"not a message of the protocol: {message!r:.80}")
    kind = message[0]
    if kind not in _KINDS:
        raise Malformed(f"unknown message kind {kind!r:.40}")
    low, high = _KINDS[kind]
    if len(message) < low or (high is not None and len(message) > high):
        raise Malformed(f"{kind!r} message with {len(message) - 1} fields")
    if kind not in ("heartbeat", "bye", "exit") and type(message[1]) is not int:
        raise Malformed(f"a {kind!r} message whose call number is {message[1]!r:.40}")
    if kind == "exit" and (type(message[1]) is not int or not isinstance(message[2], str)):
        raise Malformed("an 'exit' message is (steps, how it ended)")
    if kind == "vx" and type(message[3]) is not int:
        raise Malformed("a 'vx' message names its host")
    if kind in ("arrive", "nested", "done", "result") and type(message[2]) is not tuple:
        raise Malformed(f"a {kind!r} message names a device by a tuple")
    return message


def roundtrip(value):
    """``value`` as another host receives it (encoded and decoded)."""
    return decode(encode(value))

