#!/usr/bin/env python3
# pi0.5 chunk latency, accuracy, cold start and memory of vlac (CUDA engines) next to lerobot's own
# PI05Policy (eager, bf16 mode and fp32) with the same weights, inputs and noise; one JSON. Never
# reimplements the model: lerobot runs its own code, vlac its package.
"""Benchmark vlac's CUDA backend against lerobot's PI05Policy on one GPU (issue 13's acceptance run).

Steps, in one process (each step's seconds are in the JSON; the JSON is rewritten after every step,
so a run cut short still leaves what it measured):

 1. folder: `vlac_write_pi05 --size SIZE` (random fp32 weights, lerobot's layout and config.json),
    config.json edited to --cameras cameras (cam0, cam1, cam2 at the size's resolution);
 2. inputs: the cameras' frames in [0, 1], a pre-tokenized prompt with all tokenizer_max_length slots
    valid (3 x 256 + 200 = 968 prefix tokens at full size), noise [chunk, max_action_dim]; torch
    generators with fixed seeds, written as safetensors both sides read;
 3. `vlac compile FOLDER --backend B` (B = cuda, or cpu with --device cpu) with its meter report;
 4. vlac: `sync; echo 3 > /proc/sys/vm/drop_caches`, then bench/pi05_chunk_bench on the package: its
    first chunk is the cold start (process start to first action, package on disk, page cache
    dropped), then warm-up, then --rounds x --chunks timed chunks by stage (vision, text, prefix LM,
    each denoising step); host peak RSS from its meter, GPU memory above idle sampled by
    `nvidia-smi -lms 100` (this process has not touched CUDA yet);
 5. lerobot fp32 (TF32 off): PI05Policy built directly on the device (`with torch.device(...)`, no
    CPU init: lerobot's from_pretrained of the full fp32 folder took 138 s on the H200 host), the
    folder's model.safetensors loaded on the host and given to load_state_dict (strict, lerobot's
    own key fixing and "model." prefix), warm-up, --fp32-rounds x --fp32-chunks timed chunks;
 6. lerobot bf16: PI05Policy(config.dtype="bfloat16") built the same way (its own
    to_bfloat16_for_selected_params), the same state dict loaded (copy_ rounds to bf16 where lerobot
    keeps bf16), warm-up, --rounds x --chunks;
    lerobot's stages are timed with CUDA events around its own methods (embed_image per camera =
    vision, the rest of embed_prefix = text, the prefix forward of paligemma_with_expert = prefix LM,
    each denoise_step), synchronised once per chunk; GPU: torch's max_memory_allocated (peak reset
    after loading, the host state dict never on the GPU) and nvidia-smi above idle;
 7. accuracy: max |Δ action_normalized| of vlac vs lerobot fp32, lerobot bf16 vs lerobot fp32 (the
    error lerobot's own bf16 mode brings), vlac vs lerobot bf16.

lerobot 0.6.1 on transformers >= 5.6 (the H200 has 5.17) needs its create_causal_mask call without
`cache_position`: tools/make_pi05_fixtures.py (imported here for its size tables, make_obs and
run_lerobot) wraps it. Its size monkeypatches are given the folder's own sizes, read from the
tensor shapes, so the same code builds the full model and the small test sizes.

Usage (H200, after the device bundle is unpacked; see docs/cuda.md):
    python3 tools/bench_cuda_vs_lerobot.py --bin BUNDLE/bin --work /tmp/bw --out $OUT/bench_cuda.json
Plumbing check on a CPU machine (demo size, CPU package, lerobot on the CPU):
    python3 tools/bench_cuda_vs_lerobot.py --bin build --device cpu --size demo --work /tmp/bw \
        --out /tmp/bw/bench.json --rounds 1 --chunks 2 --fp32-rounds 1 --fp32-chunks 1 --warmup 1
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import platform
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_pi05_fixtures as mpf  # noqa: E402  (lerobot's size monkeypatches + the create_causal_mask wrap)

import lerobot  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

VLM = "paligemma_with_expert.paligemma.model.language_model."
EXPERT = "paligemma_with_expert.gemma_expert.model."


def now() -> float:
    return time.perf_counter()


def stat(xs: list[float]) -> dict | None:
    if not xs:
        return None
    return {"median_ms": statistics.median(xs), "min_ms": min(xs), "max_ms": max(xs), "n": len(xs)}


def max_abs(a, b):
    return None if a is None or b is None else float((a.float() - b.float()).abs().max())


def mean_cosine(a, b):
    """Mean over actions (rows) of the cosine similarity: issue 14's FP8 bound (>= 0.999)."""
    if a is None or b is None:
        return None
    a, b = a.float().reshape(-1, a.shape[-1]), b.float().reshape(-1, b.shape[-1])
    return float(torch.nn.functional.cosine_similarity(a, b, dim=1).mean())


# --------------------------------------------------------------------------------------------
# The folder: sizes from its tensors, cameras in its config
# --------------------------------------------------------------------------------------------


def read_shapes(st_path: Path) -> dict[str, list[int]]:
    with open(st_path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        out[k[len("model."):] if k.startswith("model.") else k] = v["shape"]
    return out


def model_from_folder(folder: Path, cameras: list[str], seed: int) -> mpf.TinyModel:
    """The TinyModel whose lerobot build has exactly the folder's tensor shapes."""
    s = read_shapes(folder / "model.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    vis = next(k for k in s if k.endswith("embeddings.patch_embedding.weight"))
    vroot = vis[: -len("embeddings.patch_embedding.weight")]

    def depth(prefix, leaf):
        d = 0
        while f"{prefix}layers.{d}.{leaf}" in s:
            d += 1
        return d

    def gemma(prefix, norm_leaf):
        hd = s[f"{prefix}layers.0.self_attn.k_proj.weight"][0]
        return mpf.Gemma(width=s[f"{prefix}layers.0.self_attn.q_proj.weight"][1], depth=depth(prefix, norm_leaf),
                         mlp_dim=s[f"{prefix}layers.0.mlp.gate_proj.weight"][0],
                         num_heads=s[f"{prefix}layers.0.self_attn.q_proj.weight"][0] // hd, head_dim=hd, num_kv_heads=1)

    feats = cfg["input_features"]
    state_dim = feats["observation.state"]["shape"][0]
    return mpf.TinyModel(
        name=f"folder:{folder.name}",
        vlm=gemma(VLM, "input_layernorm.weight"),
        expert=gemma(EXPERT, "input_layernorm.dense.weight"),
        vision=mpf.Vision(width=s[vis][0], depth=depth(vroot + "encoder.", "layer_norm1.weight"),
                          mlp_dim=s[vroot + "encoder.layers.0.mlp.fc1.weight"][0],
                          num_heads=int(cfg.get("vision_num_attention_heads", 16)), patch=s[vis][2]),
        vocab=s[VLM + "embed_tokens.weight"][0],
        image_size=int(cfg["image_resolution"][0]),
        cameras=cameras,
        state_dim=state_dim,
        action_dim=cfg["output_features"]["action"]["shape"][0],
        max_state_dim=cfg["max_state_dim"],
        max_action_dim=cfg["max_action_dim"],
        chunk_size=cfg["chunk_size"],
        n_action_steps=cfg.get("n_action_steps", cfg["chunk_size"]),
        num_steps=cfg["num_inference_steps"],
        tokenizer_max_length=cfg["tokenizer_max_length"],
        seed=seed,
    )


def set_cameras(folder: Path, n: int) -> list[str]:
    """config.json with n cameras (the first ones kept, more added as camK with the same shape)."""
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    feats = cfg["input_features"]
    cams = [k for k, v in feats.items() if v.get("type") == "VISUAL"]
    shape = feats[cams[0]]["shape"]
    keep = cams[:n]
    i = 0
    while len(keep) < n:
        name = f"observation.images.cam{i}"
        if name not in keep:
            keep.append(name)
        i += 1
    cfg["input_features"] = {**{c: {"shape": shape, "type": "VISUAL"} for c in keep},
                             **{k: v for k, v in feats.items() if v.get("type") != "VISUAL"}}
    p.write_text(json.dumps(cfg, indent=4) + "\n")
    return keep


# --------------------------------------------------------------------------------------------
# Memory probes
# --------------------------------------------------------------------------------------------


def gpu_used_mib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return float(out.splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


class GpuSampler:
    """Peak device-wide GPU memory.used (MiB) while running, from `nvidia-smi -lms 100`."""

    def __init__(self, enabled: bool):
        self.peak = None
        self.proc = None
        if not enabled or shutil.which("nvidia-smi") is None:
            return
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-i", "0", "-lms", "100"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                v = float(line.strip())
            except ValueError:
                continue
            self.peak = v if self.peak is None else max(self.peak, v)

    def stop(self) -> float | None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.thread.join(timeout=5)
        return self.peak


def drop_caches() -> str:
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "dropped (sync; echo 3 > /proc/sys/vm/drop_caches)"
    except OSError as e:
        return f"NOT dropped ({e}): the cold start is warm"


# --------------------------------------------------------------------------------------------
# lerobot
# --------------------------------------------------------------------------------------------


class StageClock:
    """Times lerobot's own methods per chunk: CUDA events on a GPU (one synchronisation per chunk),
    perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object, object]] = []

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return now()

    def wrap(self, obj, attr: str, label):
        orig = getattr(obj, attr)

        def timed(*a, **k):
            name = label(a, k) if callable(label) else label
            if name is None:
                return orig(*a, **k)
            t0 = self.mark()
            out = orig(*a, **k)
            self.marks.append((name, t0, self.mark()))
            return out

        setattr(obj, attr, timed)
        return lambda: setattr(obj, attr, orig)

    def take(self) -> dict[str, list[float]]:
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, list[float]] = {}
        for name, a, b in self.marks:
            out.setdefault(name, []).append(a.elapsed_time(b) if self.cuda else (b - a) * 1e3)
        self.marks = []
        return out


def build_lerobot(m: mpf.TinyModel, device: torch.device, dtype: str):
    cfg = mpf.make_config(dataclasses.replace(m, dtype=dtype))
    cfg.device = device.type
    with torch.device(device):
        policy = mpf.build_policy(dataclasses.replace(m, dtype=dtype), cfg)
    return policy


def load_weights(policy, state_dict: dict) -> dict:
    """lerobot's from_pretrained key handling (fix keys, add "model."), then a strict load."""
    # A real PaliGemma checkpoint ties lm_head to embed_tokens, and lerobot's key fixing copies
    # lm_head into embed_tokens. vlac_write_pi05 draws the two apart (so a runtime reading the wrong
    # one fails); vlac reads embed_tokens, so lerobot is given embed_tokens' values for both.
    state_dict = dict(state_dict)
    emb = "model." + VLM + "embed_tokens.weight"
    for head in ("model.paligemma_with_expert.paligemma.lm_head.weight", "paligemma_with_expert.paligemma.lm_head.weight"):
        if head in state_dict and emb in state_dict:
            state_dict[head] = state_dict[emb]
    fixed = policy._fix_pytorch_state_dict_keys(state_dict, policy.config)  # noqa: SLF001
    sd = {(k if k.startswith("model.") else f"model.{k}"): v for k, v in fixed.items()}
    # transformers >= 5.6 flattened SiglipVisionModel ("vision_tower.vision_model.x" -> "vision_tower.x");
    # vlac_write_pi05 writes the older names (vlac reads both): rename to what this build expects.
    want = set(policy.state_dict().keys())
    for old, new in (("vision_tower.vision_model.", "vision_tower."), ("vision_tower.", "vision_tower.vision_model.")):
        for k in [k for k in sd if k not in want and old in k]:
            if k.replace(old, new, 1) in want:
                sd[k.replace(old, new, 1)] = sd.pop(k)
    missing, unexpected = policy.load_state_dict(sd, strict=False)
    loaded = policy.state_dict()
    if emb in state_dict and not torch.equal(loaded[emb].cpu(), state_dict[emb].to(loaded[emb].dtype)):
        raise RuntimeError("lerobot's embedding table differs from the folder's embed_tokens after loading")
    # Tied or unused heads may be absent on one side; anything else is a mismatch.
    if [k for k in missing if "lm_head" not in k] or [k for k in unexpected if "lm_head" not in k]:
        raise RuntimeError(f"lerobot state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    policy.eval()
    return {"missing": missing, "unexpected": unexpected}


def time_lerobot(policy, batch, noise, device, warmup: int, rounds: int, chunks: int) -> dict:
    model = policy.model
    pwe = model.paligemma_with_expert
    clock = StageClock(device)
    step = {"k": 0}

    def pwe_label(a, k):
        e = k.get("inputs_embeds")
        return "prefix_lm" if e is not None and e[1] is None else None

    def step_label(a, k):
        name = f"step.{step['k']}"
        step["k"] += 1
        return name

    undo = [clock.wrap(pwe, "embed_image", "vision"), clock.wrap(model, "embed_prefix", "embed_prefix"),
            clock.wrap(pwe, "forward", pwe_label), clock.wrap(model, "denoise_step", step_label)]
    rows, act = [], None
    try:
        for i in range(warmup + rounds * chunks):
            step["k"] = 0
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = now()
            _, rec = mpf.run_lerobot(policy, batch, noise[None], record=False)
            a = rec["action_normalized"].float().cpu()  # synchronises: the chunk is done
            wall = (now() - t0) * 1e3
            st = clock.take()
            if act is None:
                act = a
            if i < warmup:
                continue
            r = (i - warmup) // chunks
            vision = sum(st.get("vision", []))
            row = {"round": r, "chunk_ms": wall, "vision_ms": vision,
                   "text_ms": sum(st.get("embed_prefix", [])) - vision,
                   "prefix_lm_ms": sum(st.get("prefix_lm", [])),
                   "step_ms": [st[f"step.{j}"][0] for j in range(len([k for k in st if k.startswith("step.")]))]}
            row["prefix_ms"] = row["vision_ms"] + row["text_ms"] + row["prefix_lm_ms"]
            row["denoise_ms"] = sum(row["step_ms"])
            rows.append(row)
    finally:
        for u in reversed(undo):
            u()
    return {"rows": rows, "summary": summarize(rows), "per_round": [summarize([x for x in rows if x["round"] == r])
                                                                   for r in range(rounds)], "action_normalized": act}


def summarize(rows: list[dict]) -> dict:
    out = {k: stat([r[f"{k}_ms"] for r in rows]) for k in ("chunk", "prefix", "denoise", "vision", "text", "prefix_lm")}
    n_steps = min((len(r["step_ms"]) for r in rows), default=0)
    for j in range(n_steps):
        out[f"step.{j}"] = stat([r["step_ms"][j] for r in rows])
    return out


def lerobot_run(m, dtype, sd, batch_cpu, noise, device, warmup, rounds, chunks) -> dict:
    t0 = now()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    idle = gpu_used_mib() if device.type == "cuda" else None
    policy = build_lerobot(m, device, dtype)
    t_build = now() - t0
    keys = load_weights(policy, sd)
    t_load = now() - t0 - t_build
    counts: dict[str, int] = {}
    for _, p in policy.named_parameters():
        counts[str(p.dtype).replace("torch.", "")] = counts.get(str(p.dtype).replace("torch.", ""), 0) + p.numel()
    batch = {k: v.to(device) for k, v in batch_cpu.items()}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    sampler = GpuSampler(device.type == "cuda")
    with torch.inference_mode():
        res = time_lerobot(policy, batch, noise, device, warmup, rounds, chunks)
    peak = sampler.stop()
    res.update({
        "build_seconds": t_build, "load_state_dict_seconds": t_load, "parameter_elements_by_dtype": counts,
        "keys_not_loaded": keys, "warmup": warmup, "rounds": rounds, "chunks_per_round": chunks,
    })
    if device.type == "cuda":
        res["gpu"] = {"max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
                      "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
                      "nvidia_smi_idle_mib": idle, "nvidia_smi_peak_mib": peak,
                      "nvidia_smi_above_idle_mib": None if peak is None or idle is None else peak - idle}
    del policy, batch
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, required=True,
                    help="folder with vlac, vlac_write_pi05 and pi05_chunk_bench (a build dir or the bundle's bin)")
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (policy, package, inputs); emptied first")
    ap.add_argument("--out", type=Path, required=True, help="result JSON (rewritten after every step)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda: CUDA engines + lerobot on the GPU; cpu: CPU package + lerobot on the CPU (plumbing)")
    ap.add_argument("--size", choices=["full", "medium", "demo"], default="full")
    ap.add_argument("--cameras", type=int, default=3)
    ap.add_argument("--extra-dtypes", default="",
                    help="comma-separated: more packages of the same folder (e.g. fp8,bf16-all), each compiled and "
                         "run by pi05_chunk_bench after the main one, with its latency, memory and distance from "
                         "lerobot fp32 (extra.<dtype> in the JSON); DTYPE+VAR=VALUE[+VAR=VALUE] runs that dtype's "
                         "package with those environment variables (e.g. fp8+VLAC_FP8_GEMM=1), compiled once; "
                         "fp8-w8a8 is the fp8 package compiled with --activations e4m3; "
                         "DTYPE@gptq compiles it with vlac compile --calibrate on --calibrate-obs held-out observations "
                         "(drawn like the measured one, other seeds)")
    ap.add_argument("--calibrate-obs", type=int, default=4,
                    help="held-out observations for the DTYPE@gptq extras (seeds seed+100..); the first such "
                         "package's calibration run is saved and the others round from it (--calibrate-stats)")
    ap.add_argument("--extra-chunks", type=int, default=20, help="chunks per round of each extra dtype")
    ap.add_argument("--dtype", choices=["bf16", "bf16-all", "int8", "fp8", "fp32"], default="bf16",
                    help="the vlac package's precision (vlac compile --dtype): bf16 = lerobot's bf16 split (SigLIP, "
                         "projector, adaRMS denses fp32: 6.06 GiB of weights on the GPU at full size), bf16-all = "
                         "every matrix bf16 (5.1 GiB), int8 / fp8 = those matrices 8-bit with per-row scales")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of vlac and of lerobot bf16")
    ap.add_argument("--chunks", type=int, default=50, help="chunks per round of vlac and of lerobot bf16")
    ap.add_argument("--fp32-rounds", type=int, default=3)
    ap.add_argument("--fp32-chunks", type=int, default=10, help="lerobot fp32 is the accuracy reference; fewer chunks")
    ap.add_argument("--vision", choices=["auto", "exact", "fast"], default="auto",
                    help="pi05_chunk_bench --vision: SigLIP's rounding points (auto: fast for bf16-all)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="CPU threads (vlac --device cpu, torch)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-lerobot", action="store_true", help="vlac only (checks the vlac half)")
    ap.add_argument("--gemm-cache", choices=["warm", "fresh"], default="warm",
                    help="warm: a first, short vlac process times the GEMMs and fills the tuning cache (its cold "
                         "start and memory are reported as first_load), the measured process reads it; fresh: "
                         "the measured process times them itself (VLAC_GEMM_CACHE in the work folder either way)")
    ap.add_argument("--time-budget", type=float, default=500.0,
                    help="seconds; lerobot fp32 timing shrinks to one chunk per round when past 60%% of it")
    args = ap.parse_args()
    t_start = now()
    device = torch.device(args.device)
    binp = args.bin.resolve()
    vlac, writer, bench = binp / "vlac", binp / "vlac_write_pi05", binp / "pi05_chunk_bench"
    if not bench.exists() and (binp / "bench" / "pi05_chunk_bench").exists():
        bench = binp / "bench" / "pi05_chunk_bench"
    for b in (vlac, writer, bench):
        if not b.exists():
            ap.error(f"{b} is missing")
    work = args.work
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    result: dict = {
        "benchmark": "cuda_vs_lerobot" if args.device == "cuda" else "cuda_vs_lerobot (plumbing check on the cpu)",
        "setting": {"size": args.size, "cameras": args.cameras, "vlac_dtype": args.dtype, "warmup": args.warmup,
                    "rounds": args.rounds, "chunks": args.chunks, "fp32_rounds": args.fp32_rounds,
                    "fp32_chunks": args.fp32_chunks, "seed": args.seed},
        "versions": {"lerobot": lerobot.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "python": platform.python_version(),
                     "create_causal_mask_wrapped": mpf.CAUSAL_MASK_PATCHED},
        "host": {"nproc": os.cpu_count(), "platform": platform.platform()},
        "seconds": {},
    }
    if args.device == "cuda":
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True)
        result["gpu"] = q.stdout.strip()

    def save():
        result["seconds"]["total"] = now() - t_start
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")

    def run(cmd, step, env=None, stream=False):
        """Runs one step. Progress, so a run cut off by a time limit shows how far it got (log and
        JSON): a line when the step starts and when it ends; with stream, also every stderr line of
        the step as it comes, with the seconds since the step began (a calibrated compile's phases)."""
        t0 = now()
        print(f"[bench] {step}: started", flush=True)
        p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **env} if env else None)
        tail = collections.deque(maxlen=60)  # the last lines, for the error message
        for line in p.stderr:
            tail.append(line)
            if stream:
                print(f"[bench] {step} +{now() - t0:.0f} s: {line.rstrip()}", flush=True)
        p.wait()
        err = "".join(tail)
        result["seconds"][step] = now() - t0
        print(f"[bench] {step}: {result['seconds'][step]:.1f} s, exit {p.returncode}", flush=True)
        save()
        if p.returncode != 0:
            result.setdefault("errors", []).append({"step": step, "exit": p.returncode, "stderr": err[-3000:]})
            save()
            raise SystemExit(f"{step}: {' '.join(map(str, cmd))} exited {p.returncode}: {err[-1500:]}")
        return p

    # 1-2. folder and inputs
    folder = work / "policy"
    run([writer, "--out", folder, "--size", args.size, "--seed", args.seed], "write_folder")
    cams = set_cameras(folder, args.cameras)
    m = model_from_folder(folder, cams, args.seed)
    result["model"] = dataclasses.asdict(m)
    result["folder_bytes"] = (folder / "model.safetensors").stat().st_size
    obs = mpf.make_obs(m, torch.Generator().manual_seed(args.seed + 7), m.tokenizer_max_length, batch_dim=False)
    noise = torch.randn((m.chunk_size, m.max_action_dim), generator=torch.Generator().manual_seed(args.seed + 8))
    obs_path, noise_path = work / "obs.safetensors", work / "noise.safetensors"
    save_file({k: v.contiguous() for k, v in obs.items()}, str(obs_path))
    save_file({"noise": noise.contiguous()}, str(noise_path))
    save()

    # 3. compile
    pkg = work / "policy.vlac"
    backend = "cuda" if args.device == "cuda" else "cpu"
    run([vlac, "compile", folder, "-o", pkg, "--backend", backend, "--dtype", args.dtype,
         "--report-json", work / "compile.json", "--quiet"], "vlac_compile")
    cr = json.loads((work / "compile.json").read_text())
    result["vlac_compile"] = {"backend": backend, "package_bytes": pkg.stat().st_size,
                              **{k: cr.get(k) for k in ("wall_seconds", "peak_rss_bytes", "peak_system_above_idle_bytes",
                                                        "packed_weight_bytes", "source_weight_bytes")},
                              "engines": len(cr.get("engines") or [])}
    save()

    # 4. vlac: cold start + timed chunks, one process. The GEMM tuning cache lives in the work folder;
    # with --gemm-cache warm a first short process fills it (the choices a machine keeps after its
    # first load), reported apart as first_load.
    os.environ["VLAC_GEMM_CACHE"] = str(work / "gemm_tune.txt")
    first_load = None
    if args.gemm_cache == "warm" and args.device == "cuda":
        drop_caches()
        run([bench, pkg, "--obs", obs_path, "--noise", noise_path, "--warmup", 0, "--rounds", 1, "--chunks", 1,
             "--no-recorded", "--threads", args.threads, "--out", work / "vlac_first_load.json", "--vision",
             args.vision], "vlac_first_load")
        fl = json.loads((work / "vlac_first_load.json").read_text())
        first_load = {"cold_start": fl.get("cold_start"), "peak_rss_bytes": fl["memory"].get("peak_rss_bytes"),
                      "peak_gpu_above_idle_bytes_meter": fl["memory"].get("peak_gpu_above_idle_bytes")}
    cache = drop_caches()
    idle = gpu_used_mib() if args.device == "cuda" else None
    sampler = GpuSampler(args.device == "cuda")
    t0 = now()
    run([bench, pkg, "--obs", obs_path, "--noise", noise_path, "--warmup", args.warmup, "--rounds", args.rounds,
         "--chunks", args.chunks, "--threads", args.threads, "--out", work / "vlac_bench.json",
         "--actions", work / "vlac_actions.safetensors", "--vision", args.vision], "vlac_run")
    harness_wall = now() - t0
    peak = sampler.stop()
    vb = json.loads((work / "vlac_bench.json").read_text())
    vlac_act = load_file(str(work / "vlac_actions.safetensors"))["action_normalized"].float()
    result["vlac"] = {k: vb[k] for k in ("engines_backends", "dtype", "cameras_present", "prefix_tokens", "steps",
                                         "cold_start", "summary", "per_round")}
    result["vlac"]["vision"] = vb.get("vision")
    result["vlac"]["recorded_chunk"] = vb.get("recorded_chunk")
    result["vlac"]["cold_start"]["page_cache"] = cache
    result["vlac"]["gemm_cache"] = args.gemm_cache
    if first_load is not None:
        result["vlac"]["first_load"] = first_load
    result["vlac"]["cold_start"]["harness_wall_of_whole_process_s"] = harness_wall
    mem = vb["memory"]
    result["vlac"]["memory"] = {"peak_rss_bytes": mem.get("peak_rss_bytes"),
                                "peak_gpu_above_idle_bytes_meter": mem.get("peak_gpu_above_idle_bytes"),
                                "nvidia_smi_idle_mib": idle, "nvidia_smi_peak_mib": peak,
                                "nvidia_smi_above_idle_mib": None if peak is None or idle is None else peak - idle,
                                "phases": mem.get("phases")}
    if peak is not None and idle is not None and mem.get("peak_rss_bytes"):
        result["vlac"]["memory"]["host_rss_plus_gpu_above_idle_bytes"] = \
            mem["peak_rss_bytes"] + int((peak - idle) * 1048576)
    save()
    extra_acts = {}
    calib_paths = []
    for spec in [d for d in args.extra_dtypes.split(",") if d]:
        dt, *envs = spec.split("+")
        if any("=" not in e for e in envs):
            raise SystemExit(f"--extra-dtypes: {spec!r}: settings after the dtype are VAR=VALUE, joined by '+'")
        dt, _, method = dt.partition("@")
        if method not in ("", "gptq"):
            raise SystemExit(f"--extra-dtypes: {spec!r}: the only method after '@' is gptq")
        env = dict(e.split("=", 1) for e in envs)
        tag = spec.replace("+", "_").replace("=", "-").replace("@", "-")  # for file names
        key = dt + ("-" + method if method else "")
        xp = work / f"policy-{key}.vlac"
        calib = []
        if method == "gptq":
            if not calib_paths:  # held-out observations drawn as the measured one is, other seeds
                for i in range(max(1, args.calibrate_obs)):
                    o = mpf.make_obs(m, torch.Generator().manual_seed(args.seed + 100 + i), m.tokenizer_max_length,
                                     batch_dim=False)
                    calib_paths.append(work / f"calibrate{i}.safetensors")
                    save_file({k: v.contiguous() for k, v in o.items()}, str(calib_paths[-1]))
            # The first GPTQ package runs the observations and saves their statistics; the others
            # (another dtype) round from that file: the statistics depend on neither dtype nor damping.
            stats = work / "calibration.stats.safetensors"
            if stats.exists():
                calib = ["--calibrate-stats", stats, "--threads", args.threads]
            else:
                calib = [a for c in calib_paths for a in ("--calibrate", c)] + ["--calibrate-save", stats,
                                                                               "--threads", args.threads]
        if not (work / f"compile-{key}.json").exists():  # one package per dtype and method, whatever the settings
            # fp8-w8a8: the fp8 package compiled with e4m3 activations (same engines, run as W8A8).
            dargs = ["--dtype", "fp8", "--activations", "e4m3"] if dt == "fp8-w8a8" else ["--dtype", dt]
            # Not --quiet: its log lines stream into the bench log (a calibrated compile runs the
            # observations in fp32 on the CPU, minutes on a slow host).
            run([vlac, "compile", folder, "-o", xp, "--backend", backend, *dargs, *calib, "--report-json",
                 work / f"compile-{key}.json"], f"vlac_compile_{key}", stream=True)
        xc = json.loads((work / f"compile-{key}.json").read_text())
        run([bench, xp, "--obs", obs_path, "--noise", noise_path, "--warmup", args.warmup, "--rounds", args.rounds,
             "--chunks", args.extra_chunks, "--threads", args.threads, "--out", work / f"vlac_bench_{tag}.json",
             "--actions", work / f"vlac_actions_{tag}.safetensors", "--vision", args.vision], f"vlac_run_{tag}", env)
        xb = json.loads((work / f"vlac_bench_{tag}.json").read_text())
        extra_acts[spec] = load_file(str(work / f"vlac_actions_{tag}.safetensors"))["action_normalized"].float()
        xm = xb["memory"]
        result.setdefault("extra", {})[spec] = {
            "environment": env,
            "package_bytes": xp.stat().st_size, "packed_weight_bytes": xc.get("packed_weight_bytes"),
            "compile_wall_seconds": xc.get("wall_seconds"), "compile_peak_rss_bytes": xc.get("peak_rss_bytes"),
            "recorded_chunk": (xb.get("recorded_chunk") or {}).get("summary"), "summary": xb.get("summary"),
            "cold_start": xb.get("cold_start"),
            "memory": {"peak_rss_bytes": xm.get("peak_rss_bytes"),
                       "peak_gpu_above_idle_bytes_meter": xm.get("peak_gpu_above_idle_bytes"),
                       "sum_bytes": (xm.get("peak_rss_bytes") or 0) + (xm.get("peak_gpu_above_idle_bytes") or 0)}}
        save()
    if args.skip_lerobot:
        save()
        return 0

    # 5-6. lerobot fp32 then bf16, same weights/inputs/noise
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    t0 = now()
    sd = load_file(str(folder / "model.safetensors"))  # host memory; never held on the GPU
    result["seconds"]["lerobot_read_state_dict"] = now() - t0
    batch = mpf.to_batch(obs)
    shrink = now() - t_start > 0.6 * args.time_budget
    t0 = now()
    fp32 = lerobot_run(m, "float32", sd, batch, noise, device, min(args.warmup, 2),
                       args.fp32_rounds, 1 if shrink else args.fp32_chunks)
    result["seconds"]["lerobot_fp32"] = now() - t0
    ref = fp32.pop("action_normalized")
    fp32.pop("rows")
    result["lerobot_fp32"] = fp32
    save()
    t0 = now()
    bf16 = lerobot_run(m, "bfloat16", sd, batch, noise, device, args.warmup, args.rounds, args.chunks)
    result["seconds"]["lerobot_bf16"] = now() - t0
    bact = bf16.pop("action_normalized")
    bf16.pop("rows")
    result["lerobot_bf16"] = bf16
    del sd

    # 7. accuracy and the headline
    result["accuracy"] = {
        "max_abs_delta_action_normalized": {
            "vlac_vs_lerobot_fp32": max_abs(vlac_act, ref),
            "lerobot_bf16_vs_lerobot_fp32": max_abs(bact, ref),
            "vlac_vs_lerobot_bf16": max_abs(vlac_act, bact),
        },
        "mean_action_cosine": {"vlac_vs_lerobot_fp32": mean_cosine(vlac_act, ref),
                               "lerobot_bf16_vs_lerobot_fp32": mean_cosine(bact, ref)},
        "shape": list(ref.shape),
    }
    for dt, a in extra_acts.items():
        result["extra"][dt]["accuracy_vs_lerobot_fp32"] = {"max_abs_delta": max_abs(a, ref), "mean_action_cosine": mean_cosine(a, ref)}
    save_file({"action_normalized": ref.contiguous()}, str(work / "lerobot_fp32_actions.safetensors"))
    acc = result["accuracy"]["max_abs_delta_action_normalized"]
    acc["vlac_within_lerobot_bf16_error"] = (acc["vlac_vs_lerobot_fp32"] is not None and
                                             acc["vlac_vs_lerobot_fp32"] <= acc["lerobot_bf16_vs_lerobot_fp32"])
    # The headline is the chunk as the runtime runs it (recorded once, replayed); the stage-timed
    # eager chunk, synchronised after every stage, gives the split and is reported beside it.
    eager, rec = result["vlac"]["summary"]["chunk"], result["vlac"].get("recorded_chunk")
    v, lb = (rec["summary"] if rec else eager), bf16["summary"]["chunk"]
    result["headline"] = {
        "vlac_chunk_median_ms": v["median_ms"], "vlac_chunk_min_ms": v["min_ms"],
        "vlac_chunk_is": "recorded (CUDA graphs)" if rec else "stage-timed eager",
        "vlac_stage_timed_chunk_median_ms": eager["median_ms"],
        "lerobot_bf16_chunk_median_ms": lb["median_ms"], "lerobot_fp32_chunk_median_ms": fp32["summary"]["chunk"]["median_ms"],
        "speedup_vs_lerobot_bf16": lb["median_ms"] / v["median_ms"] if v["median_ms"] else None,
        "cold_start_s": result["vlac"]["cold_start"]["process_start_to_first_action_s"],
        "vlac_host_rss_plus_gpu_above_idle_bytes": result["vlac"]["memory"].get("host_rss_plus_gpu_above_idle_bytes"),
        "targets": {"chunk_le_20ms": v["median_ms"] <= 20.0 if args.device == "cuda" else None,
                    "cold_start_le_10s": result["vlac"]["cold_start"]["process_start_to_first_action_s"] <= 10.0,
                    "accuracy_within_lerobot_bf16": acc["vlac_within_lerobot_bf16_error"]},
    }
    result["host_peak_rss_of_this_process_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    save()
    h = result["headline"]
    print(f"vlac {h['vlac_chunk_median_ms']:.2f} ms (min {h['vlac_chunk_min_ms']:.2f}) vs lerobot bf16 "
          f"{h['lerobot_bf16_chunk_median_ms']:.1f} ms; cold start {h['cold_start_s']:.2f} s; "
          f"max|d| vlac-fp32 {acc['vlac_vs_lerobot_fp32']:.3g}, lerobot bf16-fp32 {acc['lerobot_bf16_vs_lerobot_fp32']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
