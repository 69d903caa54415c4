#!/usr/bin/env python3
# CPU latency of lerobot's own PI05Policy.predict_action_chunk next to `vlac run` on the folder lerobot
# saved (same observation, same noise, same thread count); prints one JSON object. Never reimplements the model.
"""Benchmark vlac against lerobot's own pi0.5 on the CPU.

Builds lerobot's PI05Policy at a chosen size through tools/make_pi05_fixtures.py (imported: its
size monkeypatches, randomize_, write_policy, make_obs, run_lerobot), saves it with lerobot,
writes obs/noise safetensors (pre-tokenized prompt), then for every thread count T:

* lerobot: torch.set_num_threads(T); predict_action_chunk once to warm up, then median of --repeats
  (the denoise loop is timed by wrapping denoise_step; prefix = total - denoise);
* vlac: `vlac run FOLDER --threads T --report-json` once to warm up, then median of --repeats processes
  (load/prefix/denoise from the report, process wall time), max |Δ action_normalized| vs lerobot's;
* package: `vlac compile FOLDER` once, then `vlac run PKG --repeat N --threads T` (stage_ms).

Usage (fp32, CPU only):
    python tools/bench_cpu_vs_lerobot.py --vlac build/vlac --work /tmp/cmpwork --out result.json \
        [--size medium|tiny] [--threads 1,4,8] [--repeats 3] [--vlac-env NAME:K=V,K=V ...]
--vlac-env runs vlac once more per variant with extra environment (e.g. skx:OPENBLAS_CORETYPE=SkylakeX);
the variant "default" (the environment as found) always runs first.
Runs with lerobot 0.6.1 on transformers 5.5.x or >= 5.6 (make_pi05_fixtures wraps create_causal_mask).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_pi05_fixtures as mpf  # noqa: E402  (applies lerobot's size monkeypatches)

import lerobot  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

CAMERAS = ["observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb"]

SIZES = {
    # ~260 M parameters (SigLIP 384x6, Gemma 1024x8, expert 512x8, vocab 32000), pi0.5 layout.
    "medium": mpf.TinyModel(
        name="medium",
        vlm=mpf.Gemma(width=1024, depth=8, mlp_dim=4096, num_heads=8, head_dim=128, num_kv_heads=1),
        expert=mpf.Gemma(width=512, depth=8, mlp_dim=2048, num_heads=8, head_dim=128, num_kv_heads=1),
        vision=mpf.Vision(width=384, depth=6, mlp_dim=1536, num_heads=6, patch=14),
        vocab=32000,
        image_size=224,
        cameras=CAMERAS,
        state_dim=8,
        action_dim=7,
        max_state_dim=32,
        max_action_dim=32,
        chunk_size=50,
        n_action_steps=50,
        num_steps=10,
        tokenizer_max_length=200,
        seed=2026,
    ),
    # Seconds on 2 cores: checks the plumbing before spending device time.
    "tiny": mpf.TinyModel(
        name="tiny",
        vlm=mpf.Gemma(width=64, depth=2, mlp_dim=128, num_heads=2, head_dim=32),
        expert=mpf.Gemma(width=32, depth=2, mlp_dim=64, num_heads=2, head_dim=32),
        vision=mpf.Vision(width=32, depth=2, mlp_dim=64, num_heads=4, patch=14),
        vocab=1024,
        image_size=56,
        cameras=CAMERAS,
        state_dim=8,
        action_dim=7,
        max_state_dim=32,
        max_action_dim=32,
        chunk_size=10,
        n_action_steps=10,
        num_steps=3,
        tokenizer_max_length=32,
        seed=7,
    ),
}
N_REAL_TOKENS = {"medium": 48, "tiny": 12}


def median(xs):
    return statistics.median(xs) if xs else None


def machine_info() -> dict:
    info = {"nproc": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        info["affinity_cpus"] = len(os.sched_getaffinity(0))
    except OSError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key = line.split(":", 1)[0].strip()
            if key in ("model name", "cpu family", "model", "stepping") and key not in info:
                info[key] = line.split(":", 1)[1].strip()
            if key == "flags":
                break
        flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags"))
        info["cpu_flags_of_note"] = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
                                     if f" {f}" in flags]
        mem = next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        info["memtotal"] = mem.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        keep = ("Thread(s) per core", "Core(s) per socket", "Socket(s)", "L2 cache", "L3 cache")
        info["lscpu"] = {k.strip(): v.strip() for k, _, v in (l.partition(":") for l in out.splitlines()) if k.strip() in keep}
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def time_lerobot(policy, batch, noise, repeats: int) -> dict:
    """Warm-up once, then `repeats` timed predict_action_chunk calls; denoise_step time summed per call."""
    model = policy.model
    orig = model.denoise_step
    acc = {"t": 0.0}

    def timed_denoise(*a, **k):
        t0 = time.perf_counter()
        v = orig(*a, **k)
        acc["t"] += time.perf_counter() - t0
        return v

    model.denoise_step = timed_denoise
    totals, denoise = [], []
    act = None
    try:
        for i in range(repeats + 1):
            acc["t"] = 0.0
            t0 = time.perf_counter()
            _, rec = mpf.run_lerobot(policy, batch, noise[None], record=False)
            dt = time.perf_counter() - t0
            if i > 0:
                totals.append(dt * 1e3)
                denoise.append(acc["t"] * 1e3)
            act = rec["action_normalized"]
    finally:
        model.denoise_step = orig
    return {
        "predict_action_chunk_ms": totals,
        "median_ms": median(totals),
        "median_denoise_ms": median(denoise),
        "median_prefix_ms": median([t - d for t, d in zip(totals, denoise)]),
        "action_normalized": act,
    }


def run_cmd(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = (time.perf_counter() - t0) * 1e3
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return dt, p.stderr.strip()


def phase_ms(report: dict) -> dict:
    out = {}
    for ph in report.get("phases", []):
        if ph["name"] in ("load", "prefix", "denoise", "write"):
            out.setdefault(ph["name"], ph["wall_seconds"] * 1e3)
    return out


def time_vlac_folder(vlac, folder, obs, noise, work, threads, repeats, env) -> dict:
    rows, act = [], None
    for i in range(repeats + 1):
        out = work / f"vlac_out_t{threads}.safetensors"
        rep = work / f"vlac_report_t{threads}.json"
        wall, _ = run_cmd([vlac, "run", str(folder), "--obs", str(obs), "--noise", str(noise), "--out", str(out),
                           "--threads", str(threads), "--report-json", str(rep), "--quiet"], env)
        r = json.loads(rep.read_text())
        row = phase_ms(r)
        row["process_wall_ms"] = wall
        row["peak_rss_bytes"] = r.get("peak_rss_bytes")
        row["prefix_tokens"] = r.get("prefix_tokens")
        if i > 0:
            rows.append(row)
        act = load_file(str(out))["action_normalized"]
    med = {k: median([r[k] for r in rows]) for k in ("load", "prefix", "denoise", "process_wall_ms")}
    med["prefix_plus_denoise"] = median([r["prefix"] + r["denoise"] for r in rows])
    return {"runs": rows, "median_ms": med, "action_normalized": act}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlac", required=True)
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (policy, obs, package)")
    ap.add_argument("--out", type=Path, required=True, help="result JSON (rewritten after every thread count)")
    ap.add_argument("--size", choices=sorted(SIZES), default="medium")
    ap.add_argument("--threads", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vlac-env", action="append", default=[], metavar="NAME:K=V,K=V",
                    help="extra vlac variant with these environment variables (repeatable)")
    ap.add_argument("--time-budget", type=float, default=480.0, help="seconds; later thread counts are skipped past it")
    args = ap.parse_args()
    t_start = time.perf_counter()
    threads = [int(t) for t in args.threads.split(",")]
    m = SIZES[args.size]
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    vlac = str(Path(args.vlac).resolve())
    variants = [("default", {})]
    for spec in args.vlac_env:
        name, _, kvs = spec.partition(":")
        variants.append((name, dict(kv.split("=", 1) for kv in kvs.split(",") if kv)))

    # Build, randomize and save with lerobot.
    torch.set_num_threads(max(threads))
    t0 = time.perf_counter()
    policy = mpf.build_policy(m)
    mpf.randomize_(policy, m.seed)
    n_params = sum(p.numel() for p in policy.parameters())
    g = torch.Generator().manual_seed(m.seed)
    stats = mpf.make_stats(m, g)
    folder = work / "policy"
    mpf.write_policy(m, policy, stats, folder)
    mpf.add_vision_heads_key(folder, m.vision.num_heads)  # vlac reads SigLIP's head count from here
    obs = mpf.make_obs(m, torch.Generator().manual_seed(m.seed + 7), N_REAL_TOKENS[args.size], batch_dim=False)
    noise = torch.randn((m.chunk_size, m.max_action_dim), generator=torch.Generator().manual_seed(m.seed + 8))
    obs_path, noise_path = work / "obs.safetensors", work / "noise.safetensors"
    save_file({k: v.contiguous() for k, v in obs.items()}, str(obs_path))
    save_file({"noise": noise.contiguous()}, str(noise_path))
    batch = mpf.to_batch(obs)
    build_s = time.perf_counter() - t0
    weights_bytes = (folder / "model.safetensors").stat().st_size

    result = {
        "benchmark": "cpu_vs_lerobot",
        "what": "lerobot PI05Policy.predict_action_chunk (fp32, torch threads T) vs vlac run (fp32, --threads T) "
                "on the folder lerobot saved; same obs and noise; medians of repeats after one warm-up",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "versions": {
            "lerobot": lerobot.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "create_causal_mask_wrapped": mpf.CAUSAL_MASK_PATCHED,
            "torch_mkldnn": torch.backends.mkldnn.is_available(),
        },
        "config": {
            "size": args.size,
            "parameters": n_params,
            "model_safetensors_bytes": weights_bytes,
            "siglip": vars(m.vision),
            "gemma": vars(m.vlm),
            "expert": vars(m.expert),
            "vocab": m.vocab,
            "image_size": m.image_size,
            "cameras": m.cameras,
            "chunk_size": m.chunk_size,
            "num_inference_steps": m.num_steps,
            "max_action_dim": m.max_action_dim,
            "tokenizer_max_length": m.tokenizer_max_length,
            "real_tokens": N_REAL_TOKENS[args.size],
            "dtype": "float32",
        },
        "build_and_save_seconds": build_s,
        "repeats": args.repeats,
        "per_threads": [],
    }

    result["vlac_variants"] = {}
    for name, extra in variants:
        venv = {**env, **extra, "OPENBLAS_VERBOSE": "2"}
        p = subprocess.run([vlac, "--help"], capture_output=True, text=True, env=venv)
        core = [l.strip() for l in (p.stdout + p.stderr).splitlines() if "core" in l.lower() or "openblas" in l.lower()][:4]
        result["vlac_variants"][name] = {"env": extra, "openblas_verbose": core}

    def dump():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(args.out)

    dump()
    print(f"built {args.size}: {n_params:,} parameters, {weights_bytes:,} bytes, {build_s:.1f} s", flush=True)

    # Package once (fp32 engines), timed.
    pkg = work / "policy.vlac"
    crep = work / "compile_report.json"
    wall, _ = run_cmd([vlac, "compile", str(folder), "--out", str(pkg), "--dtype", "fp32", "--quiet",
                       "--report-json", str(crep)], env)
    c = json.loads(crep.read_text())
    result["compile"] = {
        "process_wall_ms": wall,
        "wall_seconds": c.get("wall_seconds"),
        "peak_rss_bytes": c.get("peak_rss_bytes"),
        "package_bytes": pkg.stat().st_size,
        "engines": len(c.get("engines", [])),
    }
    dump()

    for T in threads:
        if time.perf_counter() - t_start > args.time_budget:
            result.setdefault("skipped_threads", []).append(T)
            continue
        torch.set_num_threads(T)
        lr = time_lerobot(policy, batch, noise, args.repeats)
        ref = lr.pop("action_normalized")
        lr_ms = lr["median_ms"]
        row = {"threads": T, "lerobot": lr, "vlac": {}}
        for name, extra in variants:
            venv = {**env, **extra}
            vf = time_vlac_folder(vlac, folder, obs_path, noise_path, work, T, args.repeats, venv)
            out = work / f"pkg_out_t{T}.safetensors"
            rep = work / f"pkg_report_t{T}.json"
            pwall, _ = run_cmd([vlac, "run", str(pkg), "--obs", str(obs_path), "--noise", str(noise_path), "--out", str(out),
                                "--threads", str(T), "--repeat", str(args.repeats), "--report-json", str(rep), "--quiet"], venv)
            pr = json.loads(rep.read_text())
            pact = load_file(str(out))["action_normalized"]
            vact = vf.pop("action_normalized")
            finite = bool(torch.isfinite(ref).all()) and bool(torch.isfinite(vact).all())
            v_ms = vf["median_ms"]
            lat = pr.get("latency_ms") or {}
            vrow = {
                "env": extra,
                "folder": vf,
                "package": {
                    "process_wall_ms": pwall,
                    "latency_ms": lat,
                    "iterations_ms": pr.get("iterations_ms"),
                    "stage_ms": pr.get("stage_ms"),
                    "peak_rss_bytes": pr.get("peak_rss_bytes"),
                },
                "max_abs_diff_action_normalized": {
                    "folder_vs_lerobot": float((vact - ref).abs().max()),
                    "package_vs_lerobot": float((pact - ref).abs().max()),
                    "lerobot_abs_max": float(ref.abs().max()),
                    "all_finite": finite,
                },
                "speedup_lerobot_over_vlac": {
                    "prefix_plus_denoise": lr_ms / v_ms["prefix_plus_denoise"],
                    "process_wall": lr_ms / v_ms["process_wall_ms"],
                    "package_steady_prefix_plus_denoise": lr_ms / (lat["prefix"] + lat["denoise"]) if lat else None,
                },
            }
            row["vlac"][name] = vrow
            print(f"T={T} [{name}]: lerobot {lr_ms:.1f} ms (prefix {lr['median_prefix_ms']:.1f}, denoise {lr['median_denoise_ms']:.1f}) | "
                  f"vlac prefix {v_ms['prefix']:.1f} + denoise {v_ms['denoise']:.1f} = {v_ms['prefix_plus_denoise']:.1f} ms, "
                  f"load {v_ms['load']:.1f}, process {v_ms['process_wall_ms']:.1f} | "
                  f"x{vrow['speedup_lerobot_over_vlac']['prefix_plus_denoise']:.2f} | "
                  f"max|d| {vrow['max_abs_diff_action_normalized']['folder_vs_lerobot']:.2e} "
                  f"pkg {vrow['max_abs_diff_action_normalized']['package_vs_lerobot']:.2e}", flush=True)
        result["per_threads"].append(row)
        dump()

    result["total_seconds"] = time.perf_counter() - t_start
    dump()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
