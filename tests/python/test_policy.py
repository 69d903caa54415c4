"""vlac.Policy on lerobot's tiny pi0.5 fixtures: bit-identical to `vlac run`, within 1e-4 of
lerobot's own post-processed actions (fp32), lerobot's select_action/reset semantics, input
forms (batched or not, uint8 HWC or float CHW), errors, the GIL."""
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import vlac
from conftest import CASES, FIXTURES, FP32_CASES, case_batch, case_noise, read_safetensors, run_vlac, vlac_bin


def vlac_run_action(policy_path, case, tmp_path, extra=()):
    out = tmp_path / "out.safetensors"
    run_vlac("run", policy_path, "--obs", FIXTURES / case / "obs.safetensors", "--noise",
             FIXTURES / case / "noise.safetensors", "--out", out, "--quiet", *extra)
    return read_safetensors(out)[0]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", ["folder", "package"])
def test_actions_equal_vlac_run_and_lerobot(case, kind, tmp_path, packages):
    path = FIXTURES / case / "policy" if kind == "folder" else packages(case)
    policy = vlac.Policy.from_pretrained(path, device="cpu")
    chunk = policy.predict_action_chunk(case_batch(case), noise=case_noise(case))
    ref = vlac_run_action(path, case, tmp_path)
    assert isinstance(chunk, np.ndarray) and chunk.dtype == np.float32
    assert chunk.shape == (1,) + ref["action"].shape
    assert np.array_equal(chunk[0], ref["action"]), "not bit-identical to vlac run"
    normalized = policy.predict_action_chunk_normalized(case_batch(case), noise=case_noise(case))
    assert np.array_equal(normalized[0], ref["action_normalized"])
    expected = read_safetensors(FIXTURES / case / "expected.safetensors")[0]["action"]
    if case in FP32_CASES:
        assert np.max(np.abs(chunk[0] - expected)) <= 1e-4, "not within 1e-4 of lerobot's actions"


def test_batched_and_unbatched_inputs_agree():
    # tiny_a's obs has a leading batch dim of 1; tiny_b's has none: strip / add it.
    for case in ("tiny_a", "tiny_b"):
        policy = vlac.Policy.from_pretrained(FIXTURES / case / "policy")
        b = case_batch(case)
        flipped = {k: (v[0] if v.shape[:1] == (1,) and case == "tiny_a" else v[np.newaxis]) if isinstance(v, np.ndarray)
                   else v for k, v in b.items()}
        a1 = policy.predict_action_chunk(b, noise=case_noise(case))
        a2 = policy.predict_action_chunk(flipped, noise=case_noise(case)[np.newaxis])
        assert np.array_equal(a1, a2)


def test_uint8_hwc_frames_and_task_list():
    case = "pipe_b_quantiles"  # raw frames: uint8 HWC and float CHW
    policy = vlac.Policy.from_pretrained(FIXTURES / case / "policy")
    b = case_batch(case)
    assert b["observation.images.cam_high"].dtype == np.uint8
    a1 = policy.predict_action_chunk(b, noise=case_noise(case))
    b2 = dict(b)
    b2["task"] = [b["task"]]  # lerobot's batched form: a list of one string
    b2["observation.state"] = b["observation.state"].astype(np.float64)  # a robot's float64 state
    a2 = policy.predict_action_chunk(b2, noise=case_noise(case))
    assert np.array_equal(a1, a2)


def test_select_action_queue_and_reset():
    case = "pipe_b_quantiles"
    policy = vlac.Policy.from_pretrained(FIXTURES / case / "policy", seed=7)
    n = policy.config.n_action_steps
    assert n == 5 and policy.config.chunk_size == 5
    b = case_batch(case)
    ref = vlac.Policy.from_pretrained(FIXTURES / case / "policy", seed=7)
    chunk0 = ref.predict_action_chunk(b)[0]  # seed 7
    chunk1 = ref.predict_action_chunk(b)[0]  # seed 8
    assert not np.array_equal(chunk0, chunk1)
    rows = [policy.select_action(b) for _ in range(n)]
    for i, r in enumerate(rows):
        assert r.shape == (1, policy.config.action_dim)
        assert np.array_equal(r[0], chunk0[i])
    assert np.array_equal(policy.select_action(b)[0], chunk1[0])  # refilled from a new chunk
    policy.reset()
    assert len(policy._queue) == 0
    # After reset the next call runs the policy again (seed 9).
    chunk2 = ref.predict_action_chunk(b)[0]
    assert np.array_equal(policy.select_action(b)[0], chunk2[0])


def test_n_action_steps_override_and_seeded_noise_is_vlac_run_seed(tmp_path):
    case = "pipe_b_quantiles"
    policy = vlac.Policy.from_pretrained(FIXTURES / case / "policy", n_action_steps=2, seed=3)
    b = case_batch(case)
    first = policy.select_action(b)
    out = tmp_path / "o.safetensors"
    run_vlac("run", FIXTURES / case / "policy", "--obs", FIXTURES / case / "obs.safetensors", "--seed", "3", "--out",
             out, "--quiet")
    assert np.array_equal(first[0], read_safetensors(out)[0]["action"][0])
    policy.select_action(b)
    assert policy.last_stats["seed"] == 3
    policy.select_action(b)  # queue of 2 emptied: a new chunk
    assert policy.last_stats["seed"] == 4
    noise = vlac._core.gaussian_noise(3, 5, policy.config.max_action_dim)
    assert np.array_equal(policy.predict_action_chunk(b, noise=noise)[0, 0], first[0])


def test_bad_batch_raises_the_cli_message(tmp_path):
    case = "tiny_b"
    policy = vlac.Policy.from_pretrained(FIXTURES / case / "policy")
    b = {k: v for k, v in case_batch(case).items() if not k.startswith("observation.images.")}
    with pytest.raises(vlac.BadInputError) as e:
        policy.predict_action_chunk(b)
    # The CLI on a file with the same keys names the file where Python says "batch".
    from conftest import ROOT  # noqa: F401
    obs = tmp_path / "noimg.safetensors"
    _write_safetensors(obs, {k: v for k, v in b.items() if isinstance(v, np.ndarray)})
    r = run_vlac("run", FIXTURES / case / "policy", "--obs", obs, "--out", tmp_path / "o.safetensors", "--quiet",
                 check=False)
    assert r.returncode == 2
    cli = r.stderr.strip().splitlines()[0]
    assert cli == "vlac run: error: " + str(e.value).replace("batch", str(obs), 1)
    assert isinstance(e.value, ValueError)
    with pytest.raises(vlac.BadInputError, match="shape"):
        bad = case_batch(case)
        bad["observation.images.cam_high"] = np.zeros((2, 3, 40, 40), np.float32)
        policy.predict_action_chunk(bad)
    with pytest.raises(vlac.BadInputError, match="noise"):
        policy.predict_action_chunk(case_batch(case), noise=np.zeros(3, np.float32))
    with pytest.raises(vlac.BadInputError):
        policy.predict_action_chunk("not a dict")


def test_open_errors():
    with pytest.raises(vlac.BadInputError) as e:
        vlac.Policy.from_pretrained(FIXTURES / "missing_policy")
    assert "missing_policy" in str(e.value)
    with pytest.raises((vlac.Error, vlac.BadInputError)) as e:
        vlac.Policy.from_pretrained(FIXTURES / "tiny_b" / "policy", device="cuda")
    assert "cuda" in str(e.value)
    with pytest.raises(vlac.BadInputError, match="dtype"):
        vlac.Policy.from_pretrained(FIXTURES / "tiny_b" / "policy", dtype="int3")


def test_package_dtype_and_device_checked(packages):
    pkg = packages("tiny_b")  # fp32 CPU package
    with pytest.raises(vlac.BadInputError, match="compiled for fp32"):
        vlac.Policy.from_pretrained(pkg, dtype="bfloat16")
    p = vlac.Policy.from_pretrained(pkg, dtype="float32", device="cpu")
    assert p.config.kind == "package" and p.config.device == "cpu" and p.config.dtype == "fp32"


def test_device_policy_is_vlac_runs(packages, tmp_path):
    # One device policy (src/runtime/device_choice) for vlac run --device and vlac.Policy: on a
    # folder and on a CPU package, cuda gives vlac run's error where no GPU is seen (or runs on
    # it), and auto falls back to the CPU.
    # The vlac program of the same build as vlac._core (a wheel's is built without CUDA).
    own = Path(vlac.__file__).parent / "bin" / "vlac"
    prog = own if own.is_file() else vlac_bin()
    case = FIXTURES / "tiny_b"
    for path in (case / "policy", packages("tiny_b")):
        r = subprocess.run([str(prog), "run", str(path), "--obs", str(case / "obs.safetensors"), "--out",
                            str(tmp_path / "o.safetensors"), "--device", "cuda", "--quiet"], capture_output=True,
                           text=True)
        if r.returncode == 0:  # a GPU: the CPU package is re-bound to it, as vlac run does
            assert vlac.Policy.from_pretrained(path, device="cuda").config.device == "cuda"
            continue
        assert r.returncode == 2, r.stderr
        cli = r.stderr.strip().splitlines()[-1]
        assert cli.startswith("vlac run: error: --device cuda: "), cli
        with pytest.raises(vlac.BadInputError) as e:
            vlac.Policy.from_pretrained(path, device="cuda")
        assert "device cuda: " + cli[len("vlac run: error: --device cuda: "):] == str(e.value)
        assert vlac.Policy.from_pretrained(path, device="auto").config.device == "cpu"
    with pytest.raises(vlac.BadInputError, match="device must be cpu, cuda or auto, got 'tpu'"):
        vlac.Policy.from_pretrained(case / "policy", device="tpu")


def test_torch_is_not_imported():
    vlac.Policy.from_pretrained(FIXTURES / "tiny_b" / "policy").predict_action_chunk(case_batch("tiny_b"))
    assert "torch" not in sys.modules


def test_gil_released_while_running():
    policy = vlac.Policy.from_pretrained(FIXTURES / "tiny_a" / "policy")
    b = case_batch("tiny_a")
    policy.predict_action_chunk(b)  # plan once
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    # With a long switch interval a thread that holds the GIL in C++ never lets the spinner
    # run (C code does not reach the eval loop's switch points); releasing it does.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.01)
        before = count[0]
        # Chunks for up to 0.5 s (well inside the 1 s switch interval, so a GIL-holding policy
        # gets no forced switch): on a loaded machine the OS may not schedule the spinner during
        # the first few milliseconds-long chunks.
        deadline = time.monotonic() + 0.5
        while True:
            policy.predict_action_chunk(b)
            during = count[0] - before
            if during > 0 or time.monotonic() > deadline:
                break
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert during > 0, "no other thread ran while the policy ran: the GIL was held"


def _write_safetensors(path, tensors):
    import json

    names = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.bool_): "BOOL",
             np.dtype(np.uint8): "U8"}
    header, blobs, off = {}, [], 0
    for k, v in tensors.items():
        v = np.ascontiguousarray(v)
        header[k] = {"dtype": names[v.dtype], "shape": list(v.shape), "data_offsets": [off, off + v.nbytes]}
        blobs.append(v.tobytes())
        off += v.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))
