"""`vlac serve PACKAGE`: lerobot's async-inference policy server (gRPC service
transport.AsyncInference) over a vlac policy, for lerobot's unmodified robot client
(`python -m lerobot.async_inference.robot_client --server_address=HOST:PORT ...`).

What differs from lerobot's own server (docs/serve.md):
- the policy is the package given on the command line, opened before the first client; the
  client's setup (RemotePolicyConfig) is checked against it (policy type, features,
  actions_per_chunk <= chunk_size) and refused with a clear error when it does not fit;
- payloads are unpickled by a restricted unpickler (vlac/_safe_pickle.py), never as arbitrary objects;
- observations are size-limited, and a stream that ends early or breaks off is dropped;
- camera frames of another size than the policy's image feature are resized to it first, as
  lerobot's server does (vlac/_frame_resize.py: torch's uint8 bilinear kernel redone in numpy),
  then the policy resizes them with pad to its resolution;
- it listens on loopback unless --allow-remote is given; the protocol has no authentication.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import queue
import signal
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass

import numpy as np

from . import _frame_resize, _safe_pickle, _wire
from ._core import BadInputError, Error

log = logging.getLogger("vlac.serve")

DEFAULT_MAX_OBSERVATION_BYTES = 64 << 20
GRPC_MAX_MESSAGE = 4 << 20  # lerobot's channel limit; observations arrive in 2 MiB pieces
STATE = "observation.state"
IMAGES = "observation.images."


class SetupError(ValueError):
    pass


@dataclass
class _Setup:
    peer: str
    actions_per_chunk: int
    state_names: list  # motor keys of the raw observation, in the state's order ([] = no state)
    cameras: dict  # policy camera key -> raw observation key
    rename_map: dict
    device: str
    frame_sizes: dict  # policy camera key -> (H, W) of its image feature (frames are resized to it)


@dataclass
class _Queued:
    obs: object  # TimedObservation stand-in
    batch: dict
    received: float  # perf_counter at the first piece
    enqueued: float  # perf_counter when queued
    nbytes: int


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class PolicyServer:
    """The service's state: one policy, the setup of the client that called Ready last (lerobot's
    server keeps one client too), an observation queue of one (newest wins)."""

    def __init__(self, policy, *, fps: float = 30.0, obs_queue_timeout: float = 2.0,
                 inference_latency: float = 0.0, max_observation_bytes: int = DEFAULT_MAX_OBSERVATION_BYTES,
                 record_dir: str | None = None):
        self.policy = policy
        self.info = policy._info
        self.environment_dt = 1.0 / fps
        self.obs_queue_timeout = obs_queue_timeout
        self.inference_latency = inference_latency
        self.max_observation_bytes = max_observation_bytes
        self.record_dir = record_dir
        self._lock = threading.Lock()
        self._setup: _Setup | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._predicted: set = set()
        self._last_state: np.ndarray | None = None
        self._generation = 0  # bumped by Ready: observations of an older client are dropped
        self._inferences = 0
        self.stats = {"observations": 0, "refused_observations": 0, "inferences": 0, "setups_refused": 0}

    # --- RPCs -------------------------------------------------------------------------------

    def Ready(self, request: bytes, context) -> bytes:  # noqa: N802
        with self._lock:
            self._generation += 1
            self._setup = None
            self._queue = queue.Queue(maxsize=1)
            self._predicted = set()
            self._last_state = None
        log.info("client %s ready (server state reset)", context.peer())
        return b""

    def SendPolicyInstructions(self, request: bytes, context) -> bytes:  # noqa: N802
        import grpc

        peer = context.peer()
        try:
            data = _wire.decode_data(request)
            cfg = _safe_pickle.loads(data)
            setup = self._check_setup(cfg, peer)
        except (_wire.WireError, _safe_pickle.UnsafePickle, SetupError) as e:
            self.stats["setups_refused"] += 1
            log.error("client %s: policy setup refused: %s", peer, e)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"vlac serve: policy setup refused: {e}")
        with self._lock:
            self._setup = setup
        log.info(
            "client %s: setup accepted: pi05, %d actions per chunk (chunk %d), cameras %s, state %d values, "
            "client asked for device %r (this server runs on %s); the client's path %r is not used: "
            "the server runs %s",
            peer, setup.actions_per_chunk, self.info["chunk_size"], sorted(setup.cameras.values()),
            len(setup.state_names), setup.device, self.info["device"], getattr(cfg, "pretrained_name_or_path", "?"),
            self.info["path"],
        )
        return b""

    def SendObservations(self, request_iterator, context) -> bytes:  # noqa: N802
        import grpc

        peer = context.peer()
        t0 = time.perf_counter()
        with self._lock:
            generation = self._generation
            setup = self._setup
        # The pieces are kept as views of the received messages and joined once (one copy; none
        # for an observation of one piece, the usual case below 2 MiB).
        pieces: list = []
        nbytes = 0
        complete = False
        try:
            for raw in request_iterator:
                state, data = _wire.decode_observation(raw)
                if state == _wire.TRANSFER_BEGIN:
                    pieces, nbytes = [data], len(data)
                elif state in (_wire.TRANSFER_MIDDLE, _wire.TRANSFER_END):
                    pieces.append(data)
                    nbytes += len(data)
                else:
                    raise _wire.WireError(f"unknown transfer state {state}")
                if nbytes > self.max_observation_bytes:
                    self.stats["refused_observations"] += 1
                    log.error("client %s: observation over %d bytes: refused", peer, self.max_observation_bytes)
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"vlac serve: observation larger than {self.max_observation_bytes} bytes "
                                  "(--max-observation-bytes)")
                if state == _wire.TRANSFER_END:
                    complete = True
                    break
        except _wire.WireError as e:
            self.stats["refused_observations"] += 1
            log.error("client %s: malformed observation message: %s", peer, e)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"vlac serve: malformed observation message: {e}")
        except grpc.RpcError as e:  # the client went away mid-stream
            log.warning("client %s: observation stream broke off after %d bytes (%s): dropped", peer, nbytes,
                        getattr(e, "code", lambda: e)())
            return b""
        if not complete:
            self.stats["refused_observations"] += 1
            if not context.is_active():
                log.warning("client %s: disconnected mid-observation after %d bytes: dropped", peer, nbytes)
                return b""
            log.error("client %s: observation stream ended before TRANSFER_END (%d bytes): dropped", peer, nbytes)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"vlac serve: observation truncated: the stream ended before TRANSFER_END ({nbytes} bytes)")
        if setup is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "vlac serve: no policy setup: call Ready and SendPolicyInstructions first")
        try:
            obs = _safe_pickle.loads(pieces[0].tobytes() if len(pieces) == 1 else b"".join(pieces))
            batch = self._to_batch(obs, setup)
        except (_safe_pickle.UnsafePickle, SetupError) as e:
            self.stats["refused_observations"] += 1
            log.error("client %s: observation refused: %s", peer, e)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"vlac serve: observation refused: {e}")
        self.stats["observations"] += 1
        with self._lock:
            if generation != self._generation:
                return b""  # a new client called Ready meanwhile
            if not self._should_run(obs, batch):
                log.debug("observation #%d filtered (timestep predicted already or state too close)", obs.timestep)
                return b""
            q = self._queue
            try:
                q.get_nowait()  # newest wins
            except queue.Empty:
                pass
            q.put_nowait(_Queued(obs, batch, t0, time.perf_counter(), nbytes))
        return b""

    def GetActions(self, request: bytes, context) -> bytes:  # noqa: N802
        t_call = time.perf_counter()
        with self._lock:
            q = self._queue
            setup = self._setup
        try:
            item: _Queued = q.get(timeout=self.obs_queue_timeout)
        except queue.Empty:
            return b""
        if setup is None:
            return b""
        t_got = time.perf_counter()
        with self._lock:
            self._predicted.add(item.obs.timestep)
            self._last_state = item.batch.get(STATE)
        try:
            chunk = self.policy.predict_action_chunk(item.batch)[0]
        except (BadInputError, Error) as e:
            log.error("observation #%d: %s", item.obs.timestep, e)
            return b""
        st = self.policy.last_stats
        t_inf = time.perf_counter()
        n = setup.actions_per_chunk
        data = _safe_pickle.dumps_timed_actions(chunk[:n], float(item.obs.timestamp), self.environment_dt,
                                               int(item.obs.timestep))
        t_end = time.perf_counter()
        self._inferences += 1
        self.stats["inferences"] += 1
        if self.record_dir:
            self._record(item, chunk[:n], st)
        log.info(
            "obs #%d%s: %.1f KiB, receive %.2f ms, queue wait %.2f ms, inference %.2f ms "
            "(pre %.2f, prefix %.2f, denoise %.2f, post %.2f), serialize %.2f ms, total %.2f ms",
            item.obs.timestep, " (must go)" if item.obs.must_go else "", item.nbytes / 1024,
            1e3 * (item.enqueued - item.received), 1e3 * (t_got - item.enqueued), 1e3 * (t_inf - t_got),
            st.get("preprocess_ms", 0), st.get("prefix_ms", 0), st.get("denoise_ms", 0), st.get("postprocess_ms", 0),
            1e3 * (t_end - t_inf), 1e3 * (t_end - item.received),
        )
        if self.inference_latency > 0:
            time.sleep(max(0.0, self.inference_latency - (time.perf_counter() - t_call)))
        return _wire.encode_data(data)

    # --- checks -----------------------------------------------------------------------------

    def _check_setup(self, cfg, peer) -> _Setup:
        if not isinstance(cfg, _safe_pickle.RemotePolicyConfig):
            raise SetupError(f"expected a lerobot RemotePolicyConfig, got {type(cfg).__name__}")
        for f in ("policy_type", "lerobot_features", "actions_per_chunk"):
            if not hasattr(cfg, f):
                raise SetupError(f"RemotePolicyConfig has no {f}")
        info = self.info
        if cfg.policy_type != "pi05":
            raise SetupError(f"the client asked for policy_type {cfg.policy_type!r}; this server runs a pi05 "
                             f"policy ({info['path']})")
        n = cfg.actions_per_chunk
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= info["chunk_size"]:
            raise SetupError(f"actions_per_chunk {n!r} must be an integer in [1, chunk_size = {info['chunk_size']}]")
        feats = cfg.lerobot_features
        if not isinstance(feats, dict):
            raise SetupError("lerobot_features must be a dict")
        rename = getattr(cfg, "rename_map", {}) or {}
        if not isinstance(rename, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in rename.items()):
            raise SetupError("rename_map must map strings to strings")
        state_names: list = []
        cameras: dict = {}
        policy_cams = list(info["cameras"])
        for key, ft in feats.items():
            if not isinstance(key, str):
                raise SetupError("lerobot_features keys must be strings")
            shape, names, dtype = _feature_fields(key, ft)
            pkey = rename.get(key, key)
            if pkey == STATE:
                if dtype != "float32" or len(shape) != 1 or not names or len(names) != shape[0]:
                    raise SetupError(f"feature {key!r}: expected float32 [n] with n motor names, got {dtype} {shape}")
                if info["state_dim"] and shape[0] != info["state_dim"]:
                    raise SetupError(f"feature {key!r} has {shape[0]} values; the policy's state has "
                                     f"{info['state_dim']}")
                state_names = [str(x) for x in names]
            elif key.startswith(IMAGES):
                if pkey not in policy_cams:
                    raise SetupError(f"camera {key!r} is not a camera of the policy (cameras: {', '.join(policy_cams)})")
                if len(shape) != 3 or shape[2] != info["channels"]:
                    raise SetupError(f"camera {key!r}: expected an (H, W, {info['channels']}) frame, got {shape}")
                cameras[pkey] = key[len(IMAGES):]
        if not cameras:
            raise SetupError(f"the client has none of the policy's cameras ({', '.join(policy_cams)})")
        if info["state_dim"] and not state_names:
            raise SetupError(f"the client sends no {STATE!r}; the policy needs {info['state_dim']} state values")
        missing = [c for c in policy_cams if c not in cameras]
        if missing:
            log.warning("client %s: cameras %s absent: masked, as lerobot does", peer, ", ".join(missing))
        # lerobot's server resizes each frame to the policy's image feature size first.
        frame_sizes = {}
        for cam, shape in zip(policy_cams, info["camera_shapes"]):
            if cam in cameras and len(shape) == 3:
                frame_sizes[cam] = (int(shape[1]), int(shape[2]))
        for key, ft in feats.items():
            pkey = rename.get(key, key)
            if pkey in frame_sizes:
                shape = _feature_fields(key, ft)[0]
                if tuple(shape[:2]) != frame_sizes[pkey]:
                    log.info("client %s: camera %s sends %dx%d frames: resized to the policy's %dx%d (bilinear, "
                             "as lerobot's server does)", peer, key, shape[1], shape[0], frame_sizes[pkey][1],
                             frame_sizes[pkey][0])
        return _Setup(peer, n, state_names, cameras, rename, str(getattr(cfg, "device", "cpu")), frame_sizes)

    def _to_batch(self, obs, setup: _Setup) -> dict:
        """The policy batch of a TimedObservation, as lerobot's server builds it (state from the
        motor keys in feature order, frames by camera, the task)."""
        if not isinstance(obs, _safe_pickle.TimedObservation):
            raise SetupError(f"expected a lerobot TimedObservation, got {type(obs).__name__}")
        for f in ("timestamp", "timestep", "observation"):
            if not hasattr(obs, f):
                raise SetupError(f"TimedObservation has no {f}")
        if not isinstance(obs.timestamp, (int, float)) or isinstance(obs.timestamp, bool):
            raise SetupError("timestamp must be a number")
        if not isinstance(obs.timestep, int) or isinstance(obs.timestep, bool):
            raise SetupError("timestep must be an int")
        if not isinstance(obs.must_go, bool):
            raise SetupError("must_go must be a bool")
        raw = obs.observation
        if not isinstance(raw, dict):
            raise SetupError("observation must be a dict")
        batch: dict = {}
        if setup.state_names:
            vals = []
            for name in setup.state_names:
                if name not in raw:
                    raise SetupError(f"observation has no motor value {name!r}")
                v = raw[name]
                if isinstance(v, np.ndarray):
                    v = _safe_pickle.check_array(name, v)
                    if v.size != 1:
                        raise SetupError(f"motor value {name!r} has {v.size} elements")
                    v = v.reshape(())
                if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, bool):
                    raise SetupError(f"motor value {name!r} is a {type(v).__name__}, expected a number")
                vals.append(v)
            batch[STATE] = np.array(vals, dtype=np.float32)
        for pkey, rkey in setup.cameras.items():
            if rkey not in raw:
                continue  # masked camera
            frame = _safe_pickle.check_array(rkey, raw[rkey])
            size = setup.frame_sizes.get(pkey)
            if size is not None and frame.ndim == 3 and frame.shape[:2] != size:
                if frame.dtype != np.uint8:
                    raise SetupError(f"camera {rkey!r}: a {frame.dtype} frame of {frame.shape[1]}x{frame.shape[0]} "
                                     f"differs from the policy's {size[1]}x{size[0]}: send uint8 frames (as "
                                     "lerobot's cameras do) or frames of that size")
                frame = _frame_resize.resize_u8_hwc(frame, *size)
            batch[pkey] = frame
        task = raw.get("task", "")
        if not isinstance(task, str):
            raise SetupError("task must be a string")
        batch["task"] = task
        return batch

    def _should_run(self, obs, batch) -> bool:
        # lerobot's server: run a must-go observation always, else skip a timestep predicted
        # already or a state within 1 (L2, joint space) of the last one run.
        if obs.must_go or self._last_state is None:
            return True
        if obs.timestep in self._predicted:
            return False
        s = batch.get(STATE)
        if s is not None and self._last_state is not None and s.shape == self._last_state.shape:
            if float(np.linalg.norm(s - self._last_state)) < 1.0:
                return False
        return True

    def _record(self, item: _Queued, actions: np.ndarray, st: dict) -> None:
        k = self.stats["inferences"] - 1
        arrays = {f"batch/{key}": np.asarray(v) for key, v in item.batch.items() if key != "task"}
        tmp = os.path.join(self.record_dir, f".{k:06d}.npz")
        with open(tmp, "wb") as f:
            np.savez(f, actions=actions, timestep=np.int64(item.obs.timestep), seed=np.int64(st.get("seed", -1)),
                     task=np.str_(item.batch.get("task", "")), **arrays)
        os.replace(tmp, os.path.join(self.record_dir, f"{k:06d}.npz"))


def _feature_fields(key, ft):
    if isinstance(ft, dict):
        shape, names, dtype = ft.get("shape"), ft.get("names"), ft.get("dtype")
    elif isinstance(ft, _safe_pickle.PolicyFeature):
        shape, names, dtype = getattr(ft, "shape", None), None, "float32"
    else:
        raise SetupError(f"feature {key!r} is a {type(ft).__name__}, expected a dict")
    if isinstance(shape, list):
        shape = tuple(shape)
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d > 0 for d in shape):
        raise SetupError(f"feature {key!r}: shape must be a tuple of positive ints")
    if names is not None and not isinstance(names, (list, tuple)):
        raise SetupError(f"feature {key!r}: names must be a list")
    return shape, names, dtype


def make_grpc_server(service: PolicyServer, address: str, max_workers: int = 4):
    import grpc

    ident = _wire.identity
    handlers = {
        "Ready": grpc.unary_unary_rpc_method_handler(service.Ready, ident, ident),
        "SendPolicyInstructions": grpc.unary_unary_rpc_method_handler(service.SendPolicyInstructions, ident, ident),
        "SendObservations": grpc.stream_unary_rpc_method_handler(service.SendObservations, ident, ident),
        "GetActions": grpc.unary_unary_rpc_method_handler(service.GetActions, ident, ident),
    }
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        handlers=[grpc.method_handlers_generic_handler(_wire.SERVICE, handlers)],
        options=[("grpc.max_receive_message_length", GRPC_MAX_MESSAGE + 1024),
                 ("grpc.max_send_message_length", GRPC_MAX_MESSAGE + 1024),
                 ("grpc.so_reuseport", 0)],
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return server, port


def keep_freed_heap(mmap_threshold: int = 16 << 20, trim_threshold: int = 64 << 20) -> bool:
    """Lets glibc keep freed heap for the next observation instead of giving it back at once.
    By default a buffer over ~128 KiB (a 224x224 frame is 147 KiB) is mapped fresh, or the heap
    top trimmed after it is freed, so every observation page-faults its buffers anew: ~0.3 ms
    per frame-sized copy on the shared VM this was measured on (bench/python_overhead.py). With
    these thresholds up to 64 MiB of freed heap stays mapped (the process keeps its peak instead
    of dropping it between observations). False where it cannot be set (not glibc)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        return bool(libc.mallopt(m_mmap_threshold, mmap_threshold)) and bool(libc.mallopt(m_trim_threshold,
                                                                                          trim_threshold))
    except (OSError, AttributeError):
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="vlac serve",
        description="Serve a vlac policy to lerobot's async-inference robot client (gRPC transport.AsyncInference).",
    )
    ap.add_argument("package", help=".vlac package (vlac compile) or a lerobot pi0.5 policy folder")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback)")
    ap.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    ap.add_argument("--allow-remote", action="store_true",
                    help="allow a non-loopback --host (the protocol has no authentication: anyone who reaches "
                         "the port can drive the policy)")
    ap.add_argument("--device", default="auto",
                    help="auto, cpu or cuda, as vlac run --device (default auto: cuda when a GPU is seen)")
    ap.add_argument("--dtype", default=None, help="fp32 or bf16 (default: the package's)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of the policy (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="noise of inference k: vlac's Gaussian noise of seed + k")
    ap.add_argument("--fps", type=float, default=30.0, help="the client's control rate: spacing of the action timestamps")
    ap.add_argument("--obs-queue-timeout", type=float, default=2.0,
                    help="seconds GetActions waits for an observation before answering empty (lerobot: 2)")
    ap.add_argument("--inference-latency", type=float, default=0.0,
                    help="pad each GetActions to at least this many seconds (lerobot's pacing; default 0)")
    ap.add_argument("--max-observation-bytes", type=int, default=DEFAULT_MAX_OBSERVATION_BYTES,
                    help="refuse observations larger than this (default 64 MiB)")
    ap.add_argument("--record", metavar="DIR", help="write each observation run and its actions to DIR/NNNNNN.npz")
    ap.add_argument("--port-file", metavar="FILE", help="write the port listened on to FILE once serving")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s vlac serve %(levelname)s %(message)s", stream=sys.stderr)
    if not _is_loopback(args.host):
        if not args.allow_remote:
            sys.stderr.write(f"vlac serve: error: --host {args.host} is not a loopback address: pass --allow-remote "
                             "to listen there (the protocol has no authentication)\n")
            return 2
        log.warning("listening on %s: lerobot's async-inference protocol has NO authentication; anyone who reaches "
                    "this port can drive the policy", args.host)
    from .policy import Policy

    keep_freed_heap()
    try:
        policy = Policy.from_pretrained(args.package, device=args.device, dtype=args.dtype, threads=args.threads,
                                        seed=args.seed)
    except (BadInputError, Error) as e:
        sys.stderr.write(f"vlac serve: error: {e}\n")
        return 2 if isinstance(e, BadInputError) else 1
    if args.record:
        os.makedirs(args.record, exist_ok=True)
    service = PolicyServer(policy, fps=args.fps, obs_queue_timeout=args.obs_queue_timeout,
                           inference_latency=args.inference_latency, max_observation_bytes=args.max_observation_bytes,
                           record_dir=args.record)
    host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    try:
        server, port = make_grpc_server(service, f"{host}:{args.port}")
    except (OSError, RuntimeError) as e:
        sys.stderr.write(f"vlac serve: error: {e}\n")
        return 1
    server.start()
    log.info("serving %s on %s:%d (%s, %s, chunk %d, action_dim %d)", args.package, args.host, port,
             policy.config.device, policy.config.dtype, policy.config.chunk_size, policy.config.action_dim)
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    # SIGINT and SIGTERM stop it (a handler, since a shell starting it in the background leaves
    # SIGINT ignored).
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    while not stopping.wait(0.5):
        pass
    server.stop(grace=1.0)
    log.info("stopped: %s", service.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
