"""`vlac serve` at the protocol level: a grpcio client speaking lerobot's AsyncInference service
(the messages and pickles lerobot's robot client sends, made with lerobot's class names) against
the server. Setup checks, the restricted unpickler, truncated / oversized / broken-off
observation streams, a second client, and the actions against vlac.Policy's own."""
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

import vlac
from vlac import _wire
from vlac._frame_resize import resize_u8_hwc
from vlac.serve import PolicyServer, make_grpc_server

import lerobot_stub as lr
from conftest import FIXTURES, ROOT, vlac_bin

CASE = "pipe_b_quantiles"  # tiny_b weights, a tokenizer, lerobot's state prompt
CAMS = ["cam_high", "cam_left_wrist", "cam_right_wrist"]
MOTORS = [f"joint{i}.pos" for i in range(9)]
H = W = 40


def features(cams=CAMS, motors=MOTORS):
    ft = {"observation.state": {"dtype": "float32", "shape": (len(motors),), "names": list(motors)}}
    for c in cams:
        ft[f"observation.images.{c}"] = {"dtype": "image", "shape": (H, W, 3), "names": ["height", "width", "channels"],
                                         "info": {"is_depth_map": False}}
    return ft


def setup_bytes(**kw):
    args = dict(policy_type="pi05", pretrained_name_or_path="/somewhere/on/the/robot", lerobot_features=features(),
                actions_per_chunk=5, device="cpu")
    args.update(kw)
    return lr.dumps(lr.RemotePolicyConfig(**args))


def raw_observation(seed):
    rng = np.random.default_rng(seed)
    obs = {m: float(v) for m, v in zip(MOTORS, rng.uniform(-1, 1, len(MOTORS)))}
    for c in CAMS:
        obs[c] = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    obs["task"] = "pick up the red cube"
    return obs


def batch_of(raw):
    b = {"observation.state": np.array([raw[m] for m in MOTORS], dtype=np.float32), "task": raw["task"]}
    for c in CAMS:
        b[f"observation.images.{c}"] = raw[c]
    return b


def obs_bytes(raw, timestep=0, must_go=True):
    return lr.dumps(lr.TimedObservation(timestamp=time.time(), timestep=timestep, observation=raw, must_go=must_go))


class Client:
    def __init__(self, port):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("grpc.max_send_message_length", 4 << 20)])
        m = f"/{_wire.SERVICE}/"
        self.ready = self.channel.unary_unary(m + "Ready")
        self.setup = self.channel.unary_unary(m + "SendPolicyInstructions")
        self.stream = self.channel.stream_unary(m + "SendObservations")
        self.get = self.channel.unary_unary(m + "GetActions")

    def start(self, setup=None):
        self.ready(b"", timeout=10)
        self.setup(_wire.encode_data(setup or setup_bytes()), timeout=10)

    def send(self, data, chunk=2 << 20, states=None):
        pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] or [b""]
        if states is None:  # lerobot's send_bytes_in_chunks
            states = [_wire.TRANSFER_BEGIN] + [_wire.TRANSFER_MIDDLE] * (len(pieces) - 2) + [_wire.TRANSFER_END]
            if len(pieces) == 1:
                states = [_wire.TRANSFER_END]
        msgs = [_wire.encode_observation(s, p) for s, p in zip(states, pieces)]
        return self.stream(iter(msgs), timeout=10)

    def actions(self):
        data = _wire.decode_data(self.get(b"", timeout=30))
        return lr.loads_actions(data) if data else []

    def close(self):
        self.channel.close()


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    from conftest import run_vlac

    out = tmp_path_factory.mktemp("serve") / "pipe_b.vlac"
    run_vlac("compile", FIXTURES / CASE / "policy", "-o", out, "--dtype", "fp32", "--quiet")
    return out


@pytest.fixture()
def server(package):
    policy = vlac.Policy.from_pretrained(package, seed=0)
    service = PolicyServer(policy, obs_queue_timeout=5.0)
    srv, port = make_grpc_server(service, "127.0.0.1:0")
    srv.start()
    yield service, port
    srv.stop(grace=None)


def rpc_error(fn, *a):
    with pytest.raises(grpc.RpcError) as e:
        fn(*a)
    return e.value


def test_actions_are_vlac_policy_actions(server, package):
    service, port = server
    c = Client(port)
    c.start()
    own = vlac.Policy.from_pretrained(package, seed=0)
    for k in range(3):
        raw = raw_observation(k)
        c.send(obs_bytes(raw, timestep=10 * k))
        got = c.actions()
        assert [a.timestep for a in got] == [10 * k + i for i in range(5)]
        assert all(a.action[0] == "tensor" and a.action[1].dtype == np.float32 for a in got)
        # torch.from_numpy on the client needs writable arrays (else a warning per action).
        assert all(a.action[1].flags.writeable and a.action[1].shape == (7,) for a in got)
        want = own.predict_action_chunk(batch_of(raw))[0]  # seed k: the server's inference k
        assert np.array_equal(np.stack([a.action[1] for a in got]), want)
    ts = [a.timestamp for a in got]
    assert np.allclose(np.diff(ts), 1 / 30)
    c.close()


def test_frames_of_another_size_are_resized_as_lerobots_server_does(server, package):
    # The robot's cameras send 48x56 (H x W) and 30x40 frames; the policy's image features are 40x40.
    # lerobot's server resizes them (bilinear, uint8) to 40x40 first: the served actions are the
    # policy's on the resized frames.
    service, port = server
    sizes = {"cam_high": (48, 56), "cam_left_wrist": (30, 40), "cam_right_wrist": (H, W)}
    ft = features()
    for cam, (h, w) in sizes.items():
        ft[f"observation.images.{cam}"]["shape"] = (h, w, 3)
    c = Client(port)
    c.start(setup_bytes(lerobot_features=ft))
    rng = np.random.default_rng(7)
    raw = raw_observation(7)
    for cam, (h, w) in sizes.items():
        raw[cam] = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    c.send(obs_bytes(raw))
    got = np.stack([a.action[1] for a in c.actions()])
    resized = dict(raw)
    for cam in CAMS:
        resized[cam] = resize_u8_hwc(raw[cam], H, W)
    assert resized["cam_right_wrist"] is raw["cam_right_wrist"]  # already the feature's size: untouched
    own = vlac.Policy.from_pretrained(package, seed=0)
    assert np.array_equal(got, own.predict_action_chunk(batch_of(resized))[0])
    # A float frame of another size is refused (lerobot's cameras send uint8), then served again.
    bad = dict(raw)
    bad["cam_high"] = raw["cam_high"].astype(np.float32) / 255
    e = rpc_error(c.send, obs_bytes(bad))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "send uint8 frames" in e.details(), e.details()
    c.send(obs_bytes(raw, timestep=1))
    assert len(c.actions()) == 5
    c.close()


def test_frame_resize_hand_computed():
    # torch's uint8 bilinear (align_corners=False): fixed-point weights, round half up.
    a = (np.arange(16, dtype=np.uint8) * 10).reshape(2, 8, 1)
    # 8 -> 4 wide: each output the mean of two inputs, (x + y + 1) // 2; the height is untouched.
    assert resize_u8_hwc(a, 2, 4)[..., 0].tolist() == [[5, 25, 45, 65], [85, 105, 125, 145]]
    # 2 -> 4 wide: weights 1, 3/4 1/4, 1/4 3/4, 1 (edge taps clamp): 2.5 -> 3, 7.5 -> 8.
    assert resize_u8_hwc(a[:, :2], 2, 4)[..., 0].tolist() == [[0, 3, 8, 10], [80, 83, 88, 90]]
    # Both axes: the horizontal pass first, rounded to uint8, then the vertical one.
    b = np.array([[0, 1], [2, 5]], np.uint8)[..., None]
    # rows 0..1 -> widths 4: [0, 0.25->0, 0.75->1, 1], [2, 2.75->3, 4.25->4, 5]; then heights 4.
    assert resize_u8_hwc(b, 4, 4)[..., 0].tolist() == [[0, 0, 1, 1], [1, 1, 2, 2], [2, 2, 3, 4], [2, 3, 4, 5]]
    flat = np.full((30, 50, 3), 77, np.uint8)
    assert np.all(resize_u8_hwc(flat, 224, 224) == 77)
    same = np.zeros((4, 4, 3), np.uint8)
    assert resize_u8_hwc(same, 4, 4) is same


def test_frame_resize_equals_torch_where_installed():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    for (h, w), (oh, ow) in [((48, 56), (40, 40)), ((30, 40), (40, 40)), ((480, 640), (224, 224)), ((7, 5), (12, 3))]:
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        # lerobot.async_inference.helpers.resize_robot_observation_image
        t = torch.tensor(frame).permute(2, 0, 1).unsqueeze(0)
        want = torch.nn.functional.interpolate(t, size=(oh, ow), mode="bilinear", align_corners=False)
        want = want.squeeze(0).permute(1, 2, 0).numpy()
        assert np.array_equal(resize_u8_hwc(frame, oh, ow), want), ((h, w), (oh, ow))


def test_setup_mismatches_are_refused(server):
    service, port = server
    c = Client(port)
    c.ready(b"")
    cases = {
        "policy_type 'act'": setup_bytes(policy_type="act"),
        "actions_per_chunk 6": setup_bytes(actions_per_chunk=6),
        "not a camera of the policy": setup_bytes(lerobot_features=features(cams=["front"])),
        "has 8 values": setup_bytes(lerobot_features=features(motors=MOTORS[:8])),
        "expected a lerobot RemotePolicyConfig": lr.dumps({"policy_type": "pi05"}),
    }
    for needle, data in cases.items():
        e = rpc_error(c.setup, _wire.encode_data(data))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in e.details(), e.details()
    assert service.stats["setups_refused"] == len(cases)
    c.setup(_wire.encode_data(setup_bytes(actions_per_chunk=3)))  # a fitting one is taken
    c.send(obs_bytes(raw_observation(0)))
    assert len(c.actions()) == 3


class Evil:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return os.system, (self.cmd,)


def test_a_pickle_that_runs_code_is_refused(server, tmp_path):
    service, port = server
    c = Client(port)
    marker = tmp_path / "pwned"
    evil = pickle.dumps(Evil(f"touch {marker}"))
    e = rpc_error(c.setup, _wire.encode_data(evil))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "refused global posix.system" in e.details()
    c.start()
    raw = raw_observation(1)
    raw["task"] = Evil(f"touch {marker}")
    e = rpc_error(c.send, obs_bytes(raw))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "refused global" in e.details()
    for payload in (pickle.dumps(eval), b"cbuiltins\nexec\n(S'open(\"%s\",\"w\")'\ntR." % str(marker).encode()):
        e = rpc_error(c.send, payload)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not marker.exists(), "the payload ran"
    c.send(obs_bytes(raw_observation(2)))
    assert len(c.actions()) == 5  # still serving


def test_truncated_and_oversized_observations(server):
    service, port = server
    c = Client(port)
    c.start()
    data = obs_bytes(raw_observation(3))
    # The stream ends before TRANSFER_END.
    e = rpc_error(c.send, data[: len(data) // 2], 2 << 20, [_wire.TRANSFER_BEGIN])
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "truncated" in e.details()
    # END arrives, but the pickle inside is cut.
    e = rpc_error(c.send, data[: len(data) // 2])
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a valid pickle" in e.details()
    # Larger than the limit, in lerobot's 2 MiB pieces.
    service.max_observation_bytes = 3 << 20
    big = raw_observation(4)
    big["extra"] = np.zeros(5 << 20, np.uint8)
    e = rpc_error(c.send, obs_bytes(big))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # A message no protobuf parser would take.
    e = rpc_error(lambda: c.stream(iter([b"\x12\xff\xff\xff\x0f"]), timeout=10))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    service.max_observation_bytes = 64 << 20
    c.send(obs_bytes(raw_observation(5)), chunk=1000)  # many pieces: BEGIN, MIDDLE..., END
    assert len(c.actions()) == 5


KILLED_CLIENT = textwrap.dedent("""
    import sys, time, grpc
    sys.path.insert(0, sys.argv[2])
    from vlac import _wire
    ch = grpc.insecure_channel("127.0.0.1:" + sys.argv[1])
    stream = ch.stream_unary("/transport.AsyncInference/SendObservations")
    def pieces():
        yield _wire.encode_observation(_wire.TRANSFER_BEGIN, b"x" * (2 << 20))
        print("sent", flush=True)
        time.sleep(60)
    stream(pieces())
""")


def test_a_client_killed_mid_stream_leaves_the_server_serving(server):
    service, port = server
    first = Client(port)
    first.start()
    p = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, str(port), str(Path(vlac.__file__).parents[1])],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "sent"
        time.sleep(0.3)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    nxt = Client(port)
    nxt.start()
    raw = raw_observation(6)
    nxt.send(obs_bytes(raw))
    got = nxt.actions()
    assert len(got) == 5


def test_a_second_client_takes_over(server):
    service, port = server
    a, b = Client(port), Client(port)
    a.start()
    a.send(obs_bytes(raw_observation(7)))
    b.start(setup_bytes(actions_per_chunk=2))
    b.send(obs_bytes(raw_observation(8), timestep=3))
    got = b.actions()
    assert [x.timestep for x in got] == [3, 4]
    a.close()
    b.close()


def test_serve_command(package, tmp_path):
    env = dict(os.environ, VLAC_PYTHON=sys.executable)
    r = subprocess.run([sys.executable, "-m", "vlac.serve", str(package), "--host", "0.0.0.0"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 2 and "--allow-remote" in r.stderr and "no authentication" in r.stderr
    # The C++ program hands `serve` over to the Python server.
    r = subprocess.run([str(vlac_bin()), "serve", str(package), "--host", "10.1.2.3"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 2 and "--allow-remote" in r.stderr, r.stderr
    r = subprocess.run([str(vlac_bin()), "serve", str(package)], capture_output=True, text=True,
                       env=dict(env, VLAC_PYTHON="/nonexistent/python3"))
    assert r.returncode == 2 and "cannot run /nonexistent/python3" in r.stderr
    # A real server process: one exchange, the per-observation log line, a clean stop.
    port_file = tmp_path / "port"
    log = tmp_path / "log"
    with open(log, "w") as lf:
        p = subprocess.Popen([str(vlac_bin()), "serve", str(package), "--port", "0", "--port-file", str(port_file)],
                             stderr=lf, env=env)
    try:
        for _ in range(600):
            if port_file.exists() or p.poll() is not None:
                break
            time.sleep(0.05)
        assert port_file.exists(), log.read_text()
        c = Client(int(port_file.read_text()))
        c.start()
        c.send(obs_bytes(raw_observation(9)))
        assert len(c.actions()) == 5
        c.close()
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=20)
    text = log.read_text()
    assert "queue wait" in text and "inference" in text and "total" in text, text
