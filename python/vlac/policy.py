"""vlac.Policy: lerobot's policy verbs (from_pretrained, reset, select_action, predict_action_chunk)
over vlac's C++ runtime. The batch is what lerobot's preprocessor would take (the observation dict
before `preprocessor(...)`): vlac applies the policy's saved pre- and post-processing itself,
exactly as `vlac run` does, so the actions are in robot units and bit-identical to `vlac run`.

torch is never imported here: a torch tensor is recognised by its type's module, read through
DLPack, and the answer goes back as torch only when torch tensors came in.
"""
from __future__ import annotations

import collections
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from . import _core

_TASK = "task"


@dataclass
class PolicyConfig:
    """The fields of lerobot's PI05Config a control loop reads, as this policy has them."""

    type: str
    chunk_size: int
    n_action_steps: int
    max_action_dim: int
    action_dim: int
    max_state_dim: int
    state_dim: int
    num_inference_steps: int
    image_resolution: int
    image_features: list = field(default_factory=list)  # camera keys, config order
    device: str = "cpu"
    dtype: str = "fp32"
    kind: str = "package"  # "package" (.vlac) or "folder" (lerobot policy folder)
    path: str = ""


def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".", 1)[0] == "torch"


def _to_numpy(key: str, value: Any) -> np.ndarray:
    """A C-contiguous CPU numpy view (or copy, only where needed) of an array-like value."""
    if _is_torch(value):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        try:
            arr = np.from_dlpack(t)
        except (TypeError, RuntimeError, BufferError):
            arr = t.numpy()
    elif isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, (list, tuple, float, int, np.generic)):
        arr = np.asarray(value)
    else:
        raise _core.BadInputError(f"batch: '{key}' is a {type(value).__name__}, expected an array or a tensor")
    if arr.dtype == np.float64 or arr.dtype == np.float16:
        arr = arr.astype(np.float32)  # lerobot's processors run in float32
    elif arr.dtype == np.int64 and key.startswith("observation.") and "language" not in key:
        arr = arr.astype(np.float32)  # e.g. a state given as a list of ints
    return np.ascontiguousarray(arr)


class Policy:
    """A pi0.5 policy: a compiled .vlac package or a lerobot policy folder.

    ``predict_action_chunk(batch)`` returns ``[1, chunk_size, action_dim]`` actions in robot
    units; ``select_action(batch)`` pops one ``[1, action_dim]`` action from a queue that one
    chunk (its first ``n_action_steps`` rows) refills; ``reset()`` empties the queue.
    """

    name = "pi05"

    def __init__(self, session: "_core.Session", n_action_steps: int | None = None):
        self._session = session
        info = session.info()
        self._info = info
        n = info["n_action_steps"] if n_action_steps is None else int(n_action_steps)
        if not 1 <= n <= info["chunk_size"]:
            raise _core.BadInputError(
                f"{info['path']}: n_action_steps must be in [1, chunk_size = {info['chunk_size']}], got {n}"
            )
        self.config = PolicyConfig(
            type="pi05",
            chunk_size=info["chunk_size"],
            n_action_steps=n,
            max_action_dim=info["max_action_dim"],
            action_dim=info["action_dim"],
            max_state_dim=info["max_state_dim"],
            state_dim=info["state_dim"],
            num_inference_steps=info["num_inference_steps"],
            image_resolution=info["image_resolution"],
            image_features=list(info["cameras"]),
            device=info["device"],
            dtype=info["dtype"],
            kind=info["kind"],
            path=info["path"],
        )
        self._queue: collections.deque = collections.deque()
        self.last_stats: dict = {}

    @classmethod
    def from_pretrained(
        cls,
        pretrained_name_or_path: str | os.PathLike,
        *,
        device: str = "auto",
        dtype: str | None = None,
        threads: int = 2,
        seed: int = 0,
        n_action_steps: int | None = None,
        tokenizer: str | os.PathLike | None = None,
        pack_weights: bool = False,
    ) -> "Policy":
        """Opens a .vlac package (vlac compile) or a lerobot pi0.5 policy folder (a local path:
        vlac never downloads). device: "auto", "cpu" or "cuda", as `vlac run --device` decides
        it (the same C++ code; a named device re-binds a package's engines to it). dtype: None (the config's or the package's), "float32"/"fp32", "bfloat16"/"bf16".
        seed: without ``noise=``, call k draws vlac's Gaussian noise of seed + k (call 0 equals
        `vlac run --seed SEED`)."""
        if not isinstance(device, str):
            raise _core.BadInputError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
        session = _core.Session(
            os.fspath(pretrained_name_or_path),
            device=str(device),
            dtype="" if dtype is None else str(dtype),
            threads=int(threads),
            seed=int(seed),
            tokenizer="" if tokenizer is None else os.fspath(tokenizer),
            pack_weights=bool(pack_weights),
        )
        return cls(session, n_action_steps)

    # lerobot's nn.Module habits, harmless here.
    def eval(self) -> "Policy":
        return self

    def reset(self) -> None:
        """Empties the action queue (call it when an episode starts)."""
        self._queue.clear()

    def _run(self, batch: Mapping[str, Any], noise: Any):
        if not isinstance(batch, Mapping):
            raise _core.BadInputError(f"batch: expected a dict of observation keys, got {type(batch).__name__}")
        tensors = []
        task = ""
        torch_in = None
        for key, value in batch.items():
            if not isinstance(key, str):
                continue
            if key == _TASK or key == self._info["task_key"]:
                if isinstance(value, (list, tuple)):
                    if len(value) != 1 or not isinstance(value[0], str):
                        raise _core.BadInputError(
                            f"batch: '{key}' must be one string (or a list of one), got {len(value)} items"
                        )
                    value = value[0]
                if not isinstance(value, str):
                    raise _core.BadInputError(f"batch: '{key}' must be a string, got {type(value).__name__}")
                task = value
                continue
            if isinstance(value, (str, bytes)) or value is None:
                continue  # e.g. robot_type: not an input of pi0.5
            if _is_torch(value) and torch_in is None:
                torch_in = value
            tensors.append((key, _to_numpy(key, value)))
        if task == "" and self._info["has_preprocessor"] and not any(
            k == "observation.language.tokens" for k, _ in tensors
        ):
            raise _core.BadInputError(
                "batch: no task: give the task sentence as batch['task'] (lerobot's key) "
                "or a pre-tokenized 'observation.language.tokens'"
            )
        noise_arr = None
        if noise is not None:
            if _is_torch(noise) and torch_in is None:
                torch_in = noise
            noise_arr = _to_numpy("noise", noise).astype(np.float32, copy=False)
        action, action_normalized, stats = self._session.predict(tensors, task, noise_arr)
        self.last_stats = stats
        return action, action_normalized, torch_in is not None

    @staticmethod
    def _out(arr: np.ndarray, as_torch: bool):
        if not as_torch:
            return arr
        torch = sys.modules["torch"]  # imported already: a torch tensor came in
        return torch.from_dlpack(arr)

    def predict_action_chunk(self, batch: Mapping[str, Any], noise: Any = None):
        """[1, chunk_size, action_dim] actions in robot units for one observation. noise: the
        initial noise [chunk_size, max_action_dim] (or [1, ...]), float32, as lerobot's own
        predict_action_chunk takes it."""
        action, _, as_torch = self._run(batch, noise)
        return self._out(action[np.newaxis], as_torch)

    def predict_action_chunk_normalized(self, batch: Mapping[str, Any], noise: Any = None):
        """[1, chunk_size, max_action_dim]: the model's output before the postprocessor."""
        _, action_normalized, as_torch = self._run(batch, noise)
        return self._out(action_normalized[np.newaxis], as_torch)

    def select_action(self, batch: Mapping[str, Any], noise: Any = None):
        """One [1, action_dim] action: the next row of the queue, refilled from a new chunk's
        first n_action_steps rows when empty (the observation is used only then)."""
        if not self._queue:
            action, _, as_torch = self._run(batch, noise)
            for row in action[: self.config.n_action_steps]:
                self._queue.append((row[np.newaxis], as_torch))
        row, as_torch = self._queue.popleft()
        return self._out(row, as_torch)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"vlac.Policy({c.path!r}, {c.kind}, device={c.device}, dtype={c.dtype}, chunk {c.chunk_size}, "
            f"n_action_steps {c.n_action_steps}, action_dim {c.action_dim})"
        )
