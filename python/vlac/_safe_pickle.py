"""The pickles of lerobot's async-inference protocol, read without trusting them and written
without lerobot or torch.

Reading: a restricted unpickler resolves only the names the protocol carries: lerobot's
RemotePolicyConfig / TimedObservation / PolicyFeature / FeatureType (to plain stand-in classes
here: no lerobot code runs), numpy arrays and scalars of plain numeric dtypes (through checked
wrappers) and a few builtin containers. Any other global (os.system, builtins.eval, ...) is
refused before anything is called, and the result is checked field by field.

Writing: the answer is a list of lerobot TimedAction objects holding torch tensors, as lerobot's
robot client expects. It is pickled as calls the client itself resolves (importlib.import_module,
getattr, torch.from_numpy), so the server needs neither lerobot nor torch installed.
"""
from __future__ import annotations

import codecs
import copyreg
import importlib
import io
import math
import pickle

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
    a = np.frombuffer(bytes(memoryview(buf)), dtype=dtype)
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


class _Module:
    def __init__(self, name):
        self.name = name


class _Global:
    """module.name, resolved by the reader (getattr(import_module(module), name))."""

    def __init__(self, module: _Module, name: str):
        self.module, self.name = module, name

    def __call__(self, *args):  # pickle wants a callable in a reduce tuple; only the reader calls it
        raise TypeError(f"{self.module.name}.{self.name} is resolved by the reader of the pickle")


class _Tensor:
    def __init__(self, array: np.ndarray):
        self.array = array


class _TimedAction:
    def __init__(self, timestamp: float, timestep: int, action: _Tensor):
        self.state = {"timestamp": float(timestamp), "timestep": int(timestep), "action": action}


_TORCH_FROM_NUMPY = _Global(_Module("torch"), "from_numpy")
_TIMED_ACTION = _Global(_Module(HELPERS), "TimedAction")


class _ActionPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, _Module):
            return importlib.import_module, (obj.name,)
        if isinstance(obj, _Global):
            return getattr, (obj.module, obj.name)
        if isinstance(obj, _Tensor):
            return _TORCH_FROM_NUMPY, (obj.array,)
        if isinstance(obj, _TimedAction):
            return copyreg._reconstructor, (_TIMED_ACTION, object, None), obj.state
        return NotImplemented


def dumps_timed_actions(actions: np.ndarray, t0: float, dt: float, i0: int) -> bytes:
    """list[TimedAction] for rows of `actions` [n, action_dim]: row i at timestamp t0 + i·dt and
    timestep i0 + i, its action a float32 torch tensor [action_dim] (as lerobot's server sends)."""
    rows = [
        _TimedAction(t0 + i * dt, i0 + i, _Tensor(np.array(actions[i], dtype=np.float32, copy=True)))
        for i in range(actions.shape[0])
    ]
    buf = io.BytesIO()
    _ActionPickler(buf, protocol=4).dump(rows)
    return buf.getvalue()
