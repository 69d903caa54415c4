"""The pickles of lerobot's async-inference protocol, read without trusting them and written
without lerobot or torch.

Reading: a restricted unpickler resolves only the names the protocol carries: lerobot's
RemotePolicyConfig / TimedObservation / PolicyFeature / FeatureType (to plain stand-in classes
here: no lerobot code runs), numpy arrays and scalars of plain numeric dtypes (through checked
wrappers) and a few builtin containers. Any other global (os.system, builtins.eval, ...) is
refused before anything is called, and the result is checked field by field.

Writing: the answer is a list of lerobot TimedAction objects holding torch tensors, as lerobot's
robot client expects. It is pickled as calls the client itself resolves (importlib.import_module,
getattr, torch.from_numpy), so the server needs neither lerobot nor torch installed; the opcodes
are written directly (see dumps_timed_actions).
"""
from __future__ import annotations

import codecs
import io
import math
import pickle
import struct

import numpy as np

HELPERS = "lerobot.async_inference.helpers"
TYPES = "lerobot.configs.types"

# Plain element types an observation may hold (numpy dtype.str without the byte order).
_DTYPES = {"b1", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8"}
MAX_ARRAY_ELEMENTS = 1 << 28  # any one array: 256 Mi elements at most (before its data arrives)


class UnsafePickle(pickle.UnpicklingError):
    """The payload names something the protocol does not carry, or is malformed."""


class _Record:
    """A lerobot dataclass as plain attributes (state set by the pickle's BUILD)."""

    _fields: tuple = ()

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise UnsafePickle(f"{type(self).__name__}: state is a {type(state).__name__}, expected a dict")
        for k, v in state.items():
            if not isinstance(k, str) or k not in self._fields:
                raise UnsafePickle(f"{type(self).__name__}: unexpected field {k!r}")
            object.__setattr__(self, k, v)

    def __reduce__(self):  # never pickled back
        raise TypeError(f"{type(self).__name__} is a read-only stand-in")


class TimedObservation(_Record):
    _fields = ("timestamp", "timestep", "observation", "must_go")
    must_go = False


class RemotePolicyConfig(_Record):
    _fields = ("policy_type", "pretrained_name_or_path", "lerobot_features", "actions_per_chunk", "device", "rename_map")
    device = "cpu"
    rename_map: dict = {}


class PolicyFeature(_Record):
    _fields = ("type", "shape")


def _feature_type(value):
    if not isinstance(value, str):
        raise UnsafePickle("FeatureType value must be a string")
    return value


def _reconstruct(subtype, shape, dtype):
    # numpy's pickle makes an empty array, then sets its state (shape, dtype, bytes).
    if subtype is not np.ndarray:
        raise UnsafePickle("only numpy.ndarray arrays are accepted")
    _check_shape(shape)
    if dtype in (b"b", "b"):  # numpy's placeholder type; the real dtype comes with the state
        dtype = np.dtype(np.int8)
    elif not isinstance(dtype, np.dtype):
        dtype = _dtype(dtype)
    return np.ndarray.__new__(np.ndarray, shape, dtype)


def _check_shape(shape):
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and 0 <= d for d in shape):
        raise UnsafePickle("array shape must be a tuple of non-negative ints")
    if math.prod(shape) > MAX_ARRAY_ELEMENTS:
        raise UnsafePickle(f"array of shape {shape} is larger than {MAX_ARRAY_ELEMENTS} elements")


def _dtype(obj, align=False, copy=False):
    if isinstance(obj, bytes):
        obj = obj.decode("latin1")
    if not isinstance(obj, str) or obj.lstrip("<>|=") not in _DTYPES:
        raise UnsafePickle(f"numpy dtype {obj!r} is not a plain numeric type")
    return np.dtype(obj, align=bool(align), copy=bool(copy))


def _scalar(dtype, data=None):
    if not isinstance(dtype, np.dtype) or dtype.hasobject or dtype.str.lstrip("<>|=") not in _DTYPES:
        raise UnsafePickle("numpy scalar of a non-numeric dtype")
    if not isinstance(data, (bytes, str)):
        raise UnsafePickle("numpy scalar data must be bytes")
    if isinstance(data, str):
        data = data.encode("latin1")
    if len(data) != dtype.itemsize:
        raise UnsafePickle("numpy scalar data has the wrong size")
    return np.frombuffer(data, dtype=dtype)[0]


def _frombuffer(buf, dtype, shape, order):
    if not isinstance(dtype, np.dtype) or dtype.hasobject or dtype.fields is not None:
        raise UnsafePickle("array of a non-numeric dtype")
    _check_shape(shape)
    if order not in ("C", "F"):
        raise UnsafePickle("array order must be C or F")
    # A bytes/bytearray of the pickle's own (protocol 5 writes arrays as one) is used in place.
    a = np.frombuffer(buf if isinstance(buf, (bytes, bytearray)) else bytes(memoryview(buf)), dtype=dtype)
    return a.reshape(shape, order=order)


def _codecs_encode(text, encoding="utf-8"):
    # Protocol 2 writes bytes as _codecs.encode(str, 'latin1').
    if not isinstance(text, str) or encoding != "latin1":
        raise UnsafePickle("_codecs.encode is accepted for latin1 only")
    return codecs.encode(text, "latin1")


_ALLOWED = {
    (HELPERS, "TimedObservation"): TimedObservation,
    (HELPERS, "RemotePolicyConfig"): RemotePolicyConfig,
    (TYPES, "PolicyFeature"): PolicyFeature,
    (TYPES, "FeatureType"): _feature_type,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("_codecs", "encode"): _codecs_encode,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("collections", "OrderedDict"): dict,
}
for _m in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED[(_m, "_reconstruct")] = _reconstruct
    _ALLOWED[(_m, "scalar")] = _scalar
for _m in ("numpy.core.numeric", "numpy._core.numeric"):
    _ALLOWED[(_m, "_frombuffer")] = _frombuffer


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickle(f"refused global {module}.{name}: not part of lerobot's async-inference protocol") from None

    def persistent_load(self, pid):
        raise UnsafePickle("refused a persistent id (not part of the protocol)")


def loads(data: bytes):
    """Unpickles `data` with only the protocol's names; raises UnsafePickle otherwise."""
    try:
        return _Unpickler(io.BytesIO(data)).load()
    except UnsafePickle:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, MemoryError, OverflowError, RecursionError, UnicodeDecodeError) as e:
        raise UnsafePickle(f"not a valid pickle: {type(e).__name__}: {e}") from None


def check_array(key: str, a) -> np.ndarray:
    if type(a) is not np.ndarray or a.dtype.hasobject or a.dtype.fields is not None:
        raise UnsafePickle(f"observation '{key}': not a numeric numpy array")
    return a


# --- writing -------------------------------------------------------------------------------
# The answer's opcodes are written directly (protocol 4): a generic Pickler calls back into
# Python for every object and took ~1 ms for a 50-row chunk; this takes a few µs per row.
# What the reader builds, with plain pickle.loads:
#   chunk = numpy.ndarray((n, action_dim), "<f4", bytearray(<the rows' float32 bytes>))
#   [copyreg._reconstructor(TimedAction, object, None) with __dict__ {"timestamp": t0 + i*dt,
#    "timestep": i0 + i, "action": torch.from_numpy(chunk[i])} for i in range(n)]
# TimedAction = getattr(importlib.import_module(HELPERS), "TimedAction"), torch.from_numpy the
# same way. The rows are views of one array, as lerobot's server sends rows of one tensor.

_OP_PROTO4 = b"\x80\x04"
_MEMOIZE, _BINGET, _STACK_GLOBAL, _REDUCE, _BUILD = b"\x94", b"h", b"\x93", b"R", b"b"
_MARK, _TUPLE1, _TUPLE2, _TUPLE3, _NONE = b"(", b"\x85", b"\x86", b"\x87", b"N"
_EMPTY_LIST, _EMPTY_DICT, _SETITEMS, _APPENDS, _STOP, _POP = b"]", b"}", b"u", b"e", b".", b"0"
_KEEP = _MEMOIZE + _POP  # memoize the object on top and take it off the stack


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE (all names here are < 256 bytes)


def _int(i: int) -> bytes:
    if -(1 << 31) <= i < (1 << 31):
        return b"J" + struct.pack("<i", i)  # BININT
    n = (i.bit_length() + 8) // 8
    return b"\x8a" + bytes([n]) + i.to_bytes(n, "little", signed=True)  # LONG1


def _global(module: str, name: str) -> bytes:
    return _str(module) + _str(name) + _STACK_GLOBAL


def _resolved(module: str, name: str) -> bytes:
    # getattr(importlib.import_module(module), name): the reader imports it (torch, lerobot).
    return (_global("builtins", "getattr") + _global("importlib", "import_module") + _str(module) + _TUPLE1 + _REDUCE
            + _str(name) + _TUPLE2 + _REDUCE)


# Memo slots of the header below, in MEMOIZE order (slot 0 is the list).
_M_RECON, _M_CLASS, _M_OBJECT, _M_FROM_NUMPY, _M_GETITEM, _M_TS, _M_STEP, _M_ACTION, _M_CHUNK = range(1, 10)


def _get(slot: int) -> bytes:
    return _BINGET + bytes([slot])


_HEAD = (_global("copyreg", "_reconstructor") + _KEEP + _resolved(HELPERS, "TimedAction") + _KEEP
         + _global("builtins", "object") + _KEEP + _resolved("torch", "from_numpy") + _KEEP
         + _global("_operator", "getitem") + _KEEP + _str("timestamp") + _KEEP + _str("timestep") + _KEEP
         + _str("action") + _KEEP)
# One row, all of fixed size: the opcodes around BINFLOAT t (big-endian), BININT timestep and
# BININT i (little-endian), laid out by a packed numpy record so that n rows take one fill.
_ROW_A = (_get(_M_RECON) + _get(_M_CLASS) + _get(_M_OBJECT) + _NONE + _TUPLE3 + _REDUCE + _EMPTY_DICT + _MARK
          + _get(_M_TS) + b"G")
_ROW_B = _get(_M_STEP) + b"J"
_ROW_C = _get(_M_ACTION) + _get(_M_FROM_NUMPY) + _get(_M_GETITEM) + _get(_M_CHUNK) + b"J"
_ROW_D = _TUPLE2 + _REDUCE + _TUPLE1 + _REDUCE + _SETITEMS + _BUILD
_ROW = np.dtype([("a", f"S{len(_ROW_A)}"), ("t", ">f8"), ("b", f"S{len(_ROW_B)}"), ("step", "<i4"),
                 ("c", f"S{len(_ROW_C)}"), ("i", "<i4"), ("d", f"S{len(_ROW_D)}")])


def dumps_timed_actions(actions: np.ndarray, t0: float, dt: float, i0: int) -> bytes:
    """list[TimedAction] for rows of `actions` [n, action_dim]: row i at timestamp t0 + i·dt and
    timestep i0 + i, its action a float32 torch tensor [action_dim] (as lerobot's server sends)."""
    chunk = np.ascontiguousarray(actions, dtype="<f4")
    n, d = chunk.shape
    raw = chunk.tobytes()
    head = [_OP_PROTO4, _EMPTY_LIST, _MEMOIZE, _HEAD,
            _global("numpy", "ndarray"), _int(n), _int(d), _TUPLE2, _str("<f4"), _global("builtins", "bytearray"),
            b"B" + struct.pack("<I", len(raw)) + raw, _TUPLE1, _REDUCE, _TUPLE3, _REDUCE, _KEEP, _MARK]
    i0 = int(i0)
    if -(1 << 31) <= i0 and i0 + n <= (1 << 31):
        rows = np.empty(n, _ROW)
        rows["a"], rows["b"], rows["c"], rows["d"] = _ROW_A, _ROW_B, _ROW_C, _ROW_D
        rows["t"] = float(t0) + np.arange(n, dtype=np.float64) * float(dt)  # as t0 + i * dt in Python
        rows["step"] = i0 + np.arange(n, dtype=np.int64)
        rows["i"] = np.arange(n)
        body = rows.tobytes()
    else:  # timesteps past int32: LONG1, row by row
        body = b"".join(_ROW_A + struct.pack(">d", float(t0) + i * float(dt)) + _ROW_B[:-1] + _int(i0 + i)
                        + _ROW_C + struct.pack("<i", i) + _ROW_D for i in range(n))
    return b"".join(head) + body + _APPENDS + _STOP
