"""Checks a run of tests/python/run_lerobot_client_e2e.sh: every action lerobot's robot client
executed on the fake robot is a row of a chunk vlac serve sent, and each such chunk equals what
vlac.Policy computes (numpy and torch inputs) for the observation the robot produced, with the
noise seed the server used. Writes OUT/e2e.json.
Usage: check_lerobot_client_e2e.py OUT PACKAGE MIN_STEPS WALL_SECONDS"""
import glob
import json
import os
import re
import statistics
import sys

import numpy as np
import torch

import vlac

out, pkg, min_steps, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
CAMS = ["cam_high", "cam_left_wrist", "cam_right_wrist"]

robot_obs = []
for p in sorted(glob.glob(os.path.join(out, "robot", "obs_*.npz"))):
    z = np.load(p)
    robot_obs.append({"state": z["state"], **{c: z[f"cam/{c}"] for c in CAMS}})
with open(os.path.join(out, "robot", "actions.jsonl")) as f:
    executed = [json.loads(line)["action"] for line in f if line.strip()]
records = []
for p in sorted(glob.glob(os.path.join(out, "record", "*.npz"))):
    z = np.load(p)
    records.append({k: z[k] for k in z.files})

policy = vlac.Policy.from_pretrained(pkg, device="cpu")
D, A, H = policy.config.action_dim, policy.config.max_action_dim, policy.config.chunk_size
by_frame = {robot_obs[i][CAMS[0]].tobytes(): i for i in range(len(robot_obs))}
rows = {}  # float32 action row bytes -> (record, row)
checked = 0
for k, r in enumerate(records):
    i = by_frame.get(r["batch/observation.images.cam_high"].tobytes())
    assert i is not None, f"server record {k}: no robot observation has these frames"
    ro = robot_obs[i]
    for c in CAMS:
        assert np.array_equal(ro[c], r[f"batch/observation.images.{c}"]), f"record {k}: {c} differs from the robot's"
    state32 = ro["state"].astype(np.float32)
    assert np.array_equal(state32, r["batch/observation.state"]), f"record {k}: state differs from the robot's"
    batch = {"observation.state": state32, "task": str(r["task"]),
             **{f"observation.images.{c}": ro[c] for c in CAMS}}
    noise = vlac._core.gaussian_noise(int(r["seed"]), H, A)
    own = policy.predict_action_chunk(batch, noise=noise)[0]
    n = r["actions"].shape[0]
    assert np.array_equal(own[:n], r["actions"]), f"record {k}: vlac.Policy's chunk differs from the served one"
    tb = {key: (torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v) for key, v in batch.items()}
    own_t = policy.predict_action_chunk(tb, noise=torch.from_numpy(noise))
    assert isinstance(own_t, torch.Tensor) and torch.equal(own_t[0, :n], torch.from_numpy(r["actions"]))
    for j in range(n):
        rows.setdefault(r["actions"][j].astype(np.float32).tobytes(), (k, j))
    checked += 1

matched = 0
for step, a in enumerate(executed):
    key = np.array(a, dtype=np.float64).astype(np.float32).tobytes()
    assert np.array_equal(np.array(a, dtype=np.float64), np.array(a, dtype=np.float32).astype(np.float64)), \
        f"step {step}: the executed action is not a float32 value (aggregated?)"
    assert key in rows, f"step {step}: executed action {a} is no row of any chunk vlac served"
    matched += 1
assert len(executed) >= min_steps, f"only {len(executed)} control steps"

inf, tot, qw = [], [], []
for line in open(os.path.join(out, "server.log")):
    m = re.search(r"queue wait ([\d.]+) ms, inference ([\d.]+) ms .* total ([\d.]+) ms", line)
    if m:
        qw.append(float(m.group(1)))
        inf.append(float(m.group(2)))
        tot.append(float(m.group(3)))
summary = {
    "control_steps": len(executed),
    "observations_shown": len(robot_obs),
    "inferences_served": len(records),
    "chunks_recomputed_bit_identical": checked,
    "executed_actions_matched": matched,
    "wall_seconds_incl_client_start": wall,
    
    "server_inference_ms_median": statistics.median(inf) if inf else None,
    "server_queue_wait_ms_median": statistics.median(qw) if qw else None,
    "server_total_ms_median": statistics.median(tot) if tot else None,
    "install": json.load(open(os.path.join(out, "install.json"))),
    "lerobot": __import__("lerobot").__version__ if hasattr(__import__("lerobot"), "__version__") else "0.6.1",
    "torch": torch.__version__,
}
with open(os.path.join(out, "e2e.json"), "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps(summary, indent=2))
print(f"e2e: {matched} executed actions, {checked} chunks: all equal vlac's own")
