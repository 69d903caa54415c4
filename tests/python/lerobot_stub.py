"""Client-side stand-ins for lerobot's protocol classes, so the protocol tests can make the exact
pickles lerobot's robot client makes without installing lerobot (and torch): dataclasses with
lerobot's module and class names, registered as modules only while a test runs."""
import contextlib
import pickle
import sys
import types
from dataclasses import dataclass, field
from typing import Any

HELPERS = "lerobot.async_inference.helpers"


@dataclass
class TimedData:
    timestamp: float
    timestep: int


@dataclass
class TimedAction(TimedData):
    action: Any


@dataclass
class TimedObservation(TimedData):
    observation: dict
    must_go: bool = False


@dataclass
class RemotePolicyConfig:
    policy_type: str
    pretrained_name_or_path: str
    lerobot_features: dict
    actions_per_chunk: int
    device: str = "cpu"
    rename_map: dict = field(default_factory=dict)


for _c in (TimedData, TimedAction, TimedObservation, RemotePolicyConfig):
    _c.__module__ = HELPERS


@contextlib.contextmanager
def lerobot_modules():
    names = ["lerobot", "lerobot.async_inference", HELPERS]
    saved = {n: sys.modules.get(n) for n in names}
    for n in names:
        sys.modules[n] = types.ModuleType(n)
    helpers = sys.modules[HELPERS]
    for c in (TimedData, TimedAction, TimedObservation, RemotePolicyConfig):
        setattr(helpers, c.__name__, c)
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


def dumps(obj) -> bytes:
    with lerobot_modules():
        return pickle.dumps(obj)


class FakeTorch:
    """What the client's unpickling needs of torch: from_numpy."""

    @staticmethod
    def from_numpy(a):
        return ("tensor", a)


class ActionsUnpickler(pickle.Unpickler):
    """Reads the server's list[TimedAction] as lerobot's client would, with torch and lerobot's
    helpers replaced by the stand-ins (everything else resolved normally)."""

    def find_class(self, module, name):
        if (module, name) == ("importlib", "import_module"):
            def import_module(n):
                if n == "torch":
                    return FakeTorch
                if n == HELPERS:
                    return types.SimpleNamespace(TimedAction=TimedAction)
                raise ImportError(n)
            return import_module
        return super().find_class(module, name)


def loads_actions(data: bytes):
    import io

    return ActionsUnpickler(io.BytesIO(data)).load()
