#!/usr/bin/env python3
# CPU latency of lerobot's own PI05Policy.predict_action_chunk next to `vlac run` on the folder lerobot
# saved (same observation, same noise, same thread count), in fp32 and bf16; one JSON. Never reimplements the model.
"""Benchmark vlac against lerobot's own pi0.5 on the CPU, in fp32 and bf16.

Builds lerobot's PI05Policy at a chosen size through tools/make_pi05_fixtures.py (imported: its
size monkeypatches, randomize_, write_policy, make_obs, run_lerobot), saves it with lerobot (fp32),
writes obs/noise safetensors (pre-tokenized prompt). For bf16, lerobot builds a second PI05Policy
with config.dtype = "bfloat16" (its own to_bfloat16_for_selected_params: Gemma + expert in bf16,
SigLIP, projector, RMSNorm/adaRMS and model.norm kept fp32) and loads the fp32 policy's state dict
into it (values rounded to bf16 by copy_). `vlac compile FOLDER --dtype D` makes one package per dtype.
Then for every thread count T, fp32 first, then bf16 (the most important figures come first):

* lerobot: torch.set_num_threads(T); predict_action_chunk once to warm up, then median of --repeats
  (the denoise loop is timed by wrapping denoise_step; prefix = total - denoise);
* vlac folder: `vlac run FOLDER --dtype D --threads T --report-json` once to warm up, then median of
  --repeats processes (load/prefix/denoise from the report, process wall time);
* vlac package: `vlac run policy_D.vlac --dtype D --repeat (repeats+1) --threads T`; "steady" = median of
  prefix+denoise over the iterations after the first (stage_ms, latency_ms of the last iteration kept);
* pinned (default; --no-pin turns it off): each (dtype, T) block runs every thread of this process
  and the vlac processes it starts on the first T allowed CPUs, so both use the very same cores;
* interleaved (default; --no-interleave turns it off): after each timed lerobot chunk, one vlac package
  process with --repeat 2 (its second iteration kept), so both see the same load of a shared host; the
  median of the per-round ratios is the steadiest speed-up figure ("speedup_interleaved");
* max |Δ action_normalized| vs lerobot of the same dtype; for bf16 also vs lerobot fp32 (and lerobot
  bf16 vs lerobot fp32, the error bf16 itself brings); speed-up = lerobot ms / vlac ms, and for bf16
  also lerobot fp32 ms / vlac bf16 ms (lerobot's default dtype).

Top-level "summary": one row per (dtype, T) with the headline numbers (also printed, one line each).
"per_threads": one row per (dtype, T) ("dtype" key; fp32 rows as before). The actions themselves go
to OUT with suffix .actions.safetensors (lerobot.D.tT, vlac_folder.D.tT, vlac_package.D.tT).

Usage (CPU only):
    python tools/bench_cpu_vs_lerobot.py --vlac build/vlac --work /tmp/cmpwork --out result.json \
        [--dtypes fp32,bf16] [--size medium|tiny] [--threads 1,4,8] [--repeats 3] \
        [--time-budget S] [--vlac-lib DIR] [--vlac-env NAME:K=V,K=V ...]
--time-budget: a (dtype, T) block is skipped when the time so far plus the last block of that dtype
(a bound: more threads are faster) would pass S seconds; vlac processes are killed 45 s past S.
--vlac-lib: prepended to LD_LIBRARY_PATH for the vlac processes only (the carried bundle's lib/).
--vlac-env runs vlac once more per variant with extra environment (e.g. noamx:DNNL_MAX_CPU_ISA=AVX512_CORE_BF16);
the variable VLAC_ARGS adds command-line flags to that variant's vlac runs (e.g. packed:VLAC_ARGS=--pack-weights);
the variant "default" (the environment as found) always runs first; variants run for every dtype.
The first folder warm-up of each dtype runs with DNNL_VERBOSE=1: the oneDNN ISA line and the matmul
implementations it executed are recorded under "vlac_dnnl".
Runs with lerobot 0.6.1 on transformers 5.5.x or >= 5.6 (make_pi05_fixtures wraps create_causal_mask).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
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

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # vlac's --dtype spelling -> lerobot's config.dtype
HARD_STOP_GRACE_S = 45.0  # vlac processes still running this long past --time-budget are killed


def median(xs):
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


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


def torch_cpu_info() -> dict:
    """What torch's CPU kernels can use (bf16 matmuls go through oneDNN/AMX when these say so)."""
    info = {"torch_mkldnn": torch.backends.mkldnn.is_available()}
    try:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001  (older torch)
        pass
    try:
        info["mkldnn_bf16_supported"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # noqa: SLF001
    except Exception:  # noqa: BLE001
        pass
    return info


def build_lerobot_bf16(m, policy_fp32):
    """lerobot's own bf16 policy: PI05Policy built with config.dtype='bfloat16' (its constructor runs
    PaliGemmaWithExpertModel.to_bfloat16_for_selected_params), then the fp32 policy's weights loaded
    into it; copy_ rounds them to bf16 where lerobot keeps bf16, exactly like a .to(torch.bfloat16)."""
    p16 = mpf.build_policy(dataclasses.replace(m, dtype=DTYPES["bf16"]))
    p16.load_state_dict(policy_fp32.state_dict(), strict=True)
    p16.eval()
    counts = collections.Counter()
    for _, p in p16.named_parameters():
        counts[str(p.dtype).replace("torch.", "")] += p.numel()
    if not counts.get("bfloat16"):
        raise RuntimeError("lerobot bf16 policy has no bf16 parameters: to_bfloat16_for_selected_params did not run")
    return p16, dict(counts)


def time_lerobot(policy, batch, noise, repeats: int, between=None) -> dict:
    """Warm-up once, then `repeats` timed predict_action_chunk calls; denoise_step time summed per call.
    `between(i)`, when given, runs after timed call i (outside the timing): the interleaved vlac run."""
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
            act = rec["action_normalized"].to(torch.float32)
            if i > 0 and between is not None:
                between(i - 1)
    finally:
        model.denoise_step = orig
    return {
        "predict_action_chunk_ms": totals,
        "median_ms": median(totals),
        "median_denoise_ms": median(denoise),
        "median_prefix_ms": median([t - d for t, d in zip(totals, denoise)]),
        "action_normalized": act,
    }


def run_cmd(cmd: list[str], env: dict, timeout: float | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{' '.join(cmd)} killed after {timeout:.0f} s (past --time-budget)") from e
    dt = (time.perf_counter() - t0) * 1e3
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return dt, p.stdout + p.stderr


def phase_ms(report: dict) -> dict:
    out = {}
    for ph in report.get("phases", []):
        if ph["name"] in ("load", "prefix", "denoise", "write"):
            out.setdefault(ph["name"], ph["wall_seconds"] * 1e3)
    return out


def dnnl_verbose_summary(text: str) -> dict:
    """oneDNN verbose lines (v2 'dnnl_verbose,exec,cpu,matmul,IMPL,...' or v3 'onednn_verbose,...,exec,cpu,...'):
    the info lines and, per (primitive, implementation, data types), how many executions and their ms."""
    info, execs = [], {}
    for line in text.splitlines():
        if not (line.startswith("dnnl_verbose") or line.startswith("onednn_verbose")):
            continue
        f = line.split(",")
        if "info" in f[1:3] and len(info) < 12:
            info.append(line.strip())
            continue
        if "exec" not in f:
            continue
        i = f.index("exec")
        try:
            kind, impl, mds = f[i + 2], f[i + 3], f[i + 5]
            types = " ".join(t.split("::")[0] for t in mds.split() if t[:3] in ("src", "wei", "dst"))
            key = f"{kind} {impl} {types}".strip()
            e = execs.setdefault(key, {"n": 0, "ms": 0.0})
            e["n"] += 1
            e["ms"] += float(f[-1])
        except (IndexError, ValueError):
            continue
    return {"info": info, "exec": dict(sorted(execs.items(), key=lambda kv: -kv[1]["ms"]))}


def time_vlac_folder(vlac, folder, obs, noise, work, dtype, threads, repeats, env, tag, timeout, verbose_first=False) -> dict:
    rows, act, dnnl = [], None, None
    for i in range(repeats + 1):
        out = work / f"vlac_out_{tag}_t{threads}.safetensors"
        rep = work / f"vlac_report_{tag}_t{threads}.json"
        # The warm-up run may print oneDNN's verbose lines: it is not timed.
        venv = {**env, "DNNL_VERBOSE": "1", "ONEDNN_VERBOSE": "1"} if (i == 0 and verbose_first) else env
        wall, text = run_cmd([vlac, "run", str(folder), "--obs", str(obs), "--noise", str(noise), "--out", str(out),
                              "--dtype", dtype, "--threads", str(threads), "--report-json", str(rep), "--quiet",
                              *env.get("VLAC_ARGS", "").split()],
                             venv, timeout())
        if i == 0 and verbose_first:
            dnnl = dnnl_verbose_summary(text)
        r = json.loads(rep.read_text())
        row = phase_ms(r)
        row["process_wall_ms"] = wall
        row["peak_rss_bytes"] = r.get("peak_rss_bytes")
        row["prefix_tokens"] = r.get("prefix_tokens")
        row["dtype"] = r.get("dtype")
        if i > 0:
            rows.append(row)
        act = load_file(str(out))["action_normalized"].to(torch.float32)
    med = {k: median([r[k] for r in rows]) for k in ("load", "prefix", "denoise", "process_wall_ms")}
    med["prefix_plus_denoise"] = median([r["prefix"] + r["denoise"] for r in rows])
    return {"runs": rows, "median_ms": med, "action_normalized": act, "dnnl_verbose": dnnl}


def time_vlac_package(vlac, pkg, obs, noise, work, dtype, threads, repeats, env, tag, timeout) -> dict:
    out = work / f"pkg_out_{tag}_t{threads}.safetensors"
    rep = work / f"pkg_report_{tag}_t{threads}.json"
    # One process, repeats+1 iterations: the first maps and faults the engines in (not "steady").
    wall, _ = run_cmd([vlac, "run", str(pkg), "--obs", str(obs), "--noise", str(noise), "--out", str(out),
                       "--dtype", dtype, "--threads", str(threads), "--repeat", str(repeats + 1),
                       "--report-json", str(rep), "--quiet", *env.get("VLAC_ARGS", "").split()], env, timeout())
    pr = json.loads(rep.read_text())
    its = pr.get("iterations_ms") or []
    steady = its[1:] or its
    return {
        "process_wall_ms": wall,
        "latency_ms": pr.get("latency_ms") or {},
        "iterations_ms": its,
        "steady_median_ms": {
            "prefix": median([x["prefix"] for x in steady]),
            "denoise": median([x["denoise"] for x in steady]),
            "prefix_plus_denoise": median([x["prefix"] + x["denoise"] for x in steady]),
        },
        "stage_ms": pr.get("stage_ms"),
        "peak_rss_bytes": pr.get("peak_rss_bytes"),
        "dtype": pr.get("dtype"),
        "action_normalized": load_file(str(out))["action_normalized"].to(torch.float32),
    }


def max_abs(a, b):
    return float((a - b).abs().max()) if a is not None and b is not None else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlac", required=True)
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (policy, obs, packages)")
    ap.add_argument("--out", type=Path, required=True, help="result JSON (rewritten after every (dtype, T) block)")
    ap.add_argument("--size", choices=sorted(SIZES), default="medium")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16 (each T runs them in this order)")
    ap.add_argument("--threads", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vlac-lib", default=None, help="folder prepended to LD_LIBRARY_PATH for vlac processes only")
    ap.add_argument("--vlac-env", action="append", default=[], metavar="NAME:K=V,K=V",
                    help="extra vlac variant with these environment variables (repeatable)")
    ap.add_argument("--no-interleave", dest="interleave", action="store_false",
                    help="do not alternate lerobot chunks with vlac package runs (see 'interleaved' in the JSON)")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin each (dtype, T) block to the first T CPUs (lerobot and vlac alike)")
    ap.add_argument("--time-budget", type=float, default=480.0,
                    help="seconds; a (dtype, T) block that would end past it (by the last block of that dtype) is skipped")
    args = ap.parse_args()
    t_start = time.perf_counter()
    threads = [int(t) for t in args.threads.split(",")]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        ap.error(f"--dtypes: unknown {bad} (use fp32, bf16)")
    m = SIZES[args.size]
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.vlac_lib:
        lib = str(Path(args.vlac_lib).resolve())
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    vlac = str(Path(args.vlac).resolve())
    variants = [("default", {})]
    for spec in args.vlac_env:
        name, _, kvs = spec.partition(":")
        variants.append((name, dict(kv.split("=", 1) for kv in kvs.split(",") if kv)))
    deadline = t_start + args.time_budget + HARD_STOP_GRACE_S

    def timeout():
        return max(30.0, deadline - time.perf_counter())

    # Build, randomize and save with lerobot (fp32).
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
    policies = {"fp32": policy}
    lerobot_bf16 = None
    if "bf16" in dtypes:
        t1 = time.perf_counter()
        policies["bf16"], counts = build_lerobot_bf16(m, policy)
        lerobot_bf16 = {
            "how": "PI05Policy(config.dtype='bfloat16') (lerobot's to_bfloat16_for_selected_params) + "
                   "load_state_dict of the fp32 policy",
            "parameter_elements_by_dtype": counts,
            "build_seconds": time.perf_counter() - t1,
        }

    result = {
        "benchmark": "cpu_vs_lerobot",
        "what": "lerobot PI05Policy.predict_action_chunk (fp32 and lerobot's own bf16 mode, torch threads T) vs "
                "vlac run --dtype D (--threads T) on the fp32 folder lerobot saved and on a package compiled with "
                "--dtype D; same obs and noise; medians of repeats after one warm-up",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "versions": {
            "lerobot": lerobot.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "create_causal_mask_wrapped": mpf.CAUSAL_MASK_PATCHED,
            **torch_cpu_info(),
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
            "dtype": "float32",  # of the saved folder; vlac converts with --dtype
            "dtypes": dtypes,
        },
        "lerobot_bf16": lerobot_bf16,
        "build_and_save_seconds": build_s,
        "repeats": args.repeats,
        "time_budget_s": args.time_budget,
        "summary": [],
        "per_threads": [],
    }

    result["vlac_variants"] = {}
    for name, extra in variants:
        venv = {**env, **extra, "OPENBLAS_VERBOSE": "2"}
        p = subprocess.run([vlac, "--help"], capture_output=True, text=True, env=venv)
        core = [l.strip() for l in (p.stdout + p.stderr).splitlines() if "core" in l.lower() or "openblas" in l.lower()][:4]
        result["vlac_variants"][name] = {"env": extra, "openblas_verbose": core}
    result["vlac_dnnl"] = {}

    actions = {}

    def dump():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(args.out)
        if actions:
            apath = args.out.with_suffix(".actions.safetensors")
            atmp = apath.with_name(apath.name + ".tmp")
            save_file({k: v.contiguous() for k, v in actions.items()}, str(atmp))
            atmp.replace(apath)

    dump()
    print(f"built {args.size}: {n_params:,} parameters, {weights_bytes:,} bytes, {build_s:.1f} s"
          + (f"; lerobot bf16 {lerobot_bf16['parameter_elements_by_dtype']}" if lerobot_bf16 else ""), flush=True)

    # One package per dtype, timed.
    pkgs = {}
    result["compile_by_dtype"] = {}
    for D in dtypes:
        pkg = work / f"policy_{D}.vlac"
        crep = work / f"compile_report_{D}.json"
        try:
            wall, _ = run_cmd([vlac, "compile", str(folder), "--out", str(pkg), "--dtype", D, "--quiet",
                               "--report-json", str(crep)], env, timeout())
            c = json.loads(crep.read_text())
        except Exception as e:  # noqa: BLE001  (the folder runs of this dtype still count)
            result["compile_by_dtype"][D] = {"error": f"{type(e).__name__}: {e}"[-2000:]}
            pkgs[D] = None
            print(f"compile --dtype {D} failed: {e}", flush=True)
            continue
        result["compile_by_dtype"][D] = {
            "process_wall_ms": wall,
            "wall_seconds": c.get("wall_seconds"),
            "peak_rss_bytes": c.get("peak_rss_bytes"),
            "package_bytes": pkg.stat().st_size,
            "engines": len(c.get("engines", [])),
        }
        pkgs[D] = pkg
    result["compile"] = result["compile_by_dtype"].get("fp32")  # the key of the fp32-only script
    dump()

    all_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    last_block_s: dict[str, float] = {}
    lerobot_fp32 = {}  # T -> (median ms, action) from the fp32 block
    fp32_ref_any = None  # an untimed fp32 reference when fp32 is not benchmarked

    for T in threads:
        for D in dtypes:
            elapsed = time.perf_counter() - t_start
            if elapsed > args.time_budget or elapsed + last_block_s.get(D, 0.0) > args.time_budget:
                result.setdefault("skipped", []).append({"dtype": D, "threads": T})
                if D == "fp32":
                    result.setdefault("skipped_threads", []).append(T)
                print(f"{D} T={T}: skipped (elapsed {elapsed:.0f} s, budget {args.time_budget:.0f} s)", flush=True)
                continue
            tb = time.perf_counter()
            row = {"dtype": D, "threads": T, "lerobot": None, "vlac": {}}
            if args.pin and hasattr(os, "sched_setaffinity"):
                # The same cores for both: on a shared host the CPUs differ in speed from one moment
                # and one CPU to the next, so a T-thread block runs on the first T CPUs we may use.
                row["cpus"] = pin_process(all_cpus[:T] if T <= len(all_cpus) else all_cpus)
            torch.set_num_threads(T)
            ref, lr_ms = None, None
            rounds = []  # interleaved: after each timed lerobot chunk, one vlac package process

            def vlac_round(i, D=D, T=T, rounds=rounds):
                if pkgs[D] is None:
                    return
                try:
                    r = time_vlac_package(vlac, pkgs[D], obs_path, noise_path, work, D, T, 1, env,
                                          f"{D}_interleaved", timeout)
                    r.pop("action_normalized", None)
                    rounds.append({"round": i, "vlac_steady_ms": r["steady_median_ms"]["prefix_plus_denoise"],
                                   "vlac_prefix_ms": r["steady_median_ms"]["prefix"],
                                   "vlac_denoise_ms": r["steady_median_ms"]["denoise"]})
                except Exception as e:  # noqa: BLE001
                    rounds.append({"round": i, "error": f"{type(e).__name__}: {e}"[-500:]})

            try:
                lr = time_lerobot(policies[D], batch, noise, args.repeats,
                                  between=vlac_round if args.interleave else None)
                ref = lr.pop("action_normalized")
                if rounds:
                    row["interleaved"] = interleaved_summary(lr, rounds)
                lr_ms = lr["median_ms"]
                row["lerobot"] = lr
                actions[f"lerobot.{D}.t{T}"] = ref
            except Exception as e:  # noqa: BLE001  (record and go on: vlac's figures still count)
                row["lerobot_error"] = f"{type(e).__name__}: {e}"[-2000:]
            if D == "fp32":
                if ref is not None:
                    lerobot_fp32[T] = (lr_ms, ref)
                fp32_ms, fp32_ref = lr_ms, ref
            else:
                fp32_ms, fp32_ref = lerobot_fp32.get(T, (None, None))
                if fp32_ref is None:
                    if fp32_ref_any is None:
                        try:
                            _, rec = mpf.run_lerobot(policies["fp32"], batch, noise[None], record=False)
                            fp32_ref_any = rec["action_normalized"].to(torch.float32)
                        except Exception as e:  # noqa: BLE001
                            row["lerobot_fp32_error"] = f"{type(e).__name__}: {e}"[-2000:]
                    fp32_ref = fp32_ref_any
                if ref is not None and fp32_ref is not None:
                    row["lerobot_bf16_vs_lerobot_fp32_max_abs_diff"] = max_abs(ref, fp32_ref)
            for name, extra in variants:
                venv = {**env, **extra}
                tag = f"{D}_{name}"
                try:
                    vf = time_vlac_folder(vlac, folder, obs_path, noise_path, work, D, T, args.repeats, venv, tag, timeout,
                                          verbose_first=(name == "default" and D not in result["vlac_dnnl"]))
                    dn = vf.pop("dnnl_verbose")
                    if dn is not None:
                        result["vlac_dnnl"][D] = {"threads": T, **dn}
                    vp = None
                    if pkgs[D] is not None:
                        vp = time_vlac_package(vlac, pkgs[D], obs_path, noise_path, work, D, T, args.repeats, venv, tag,
                                               timeout)
                except Exception as e:  # noqa: BLE001
                    row["vlac"][name] = {"env": extra, "error": f"{type(e).__name__}: {e}"[-2000:]}
                    print(f"{D} T={T} [{name}]: vlac failed: {e}", flush=True)
                    continue
                vact = vf.pop("action_normalized")
                pact = vp.pop("action_normalized") if vp is not None else None
                if name == "default":
                    actions[f"vlac_folder.{D}.t{T}"] = vact
                    if pact is not None:
                        actions[f"vlac_package.{D}.t{T}"] = pact
                v_ms = vf["median_ms"]
                steady = vp["steady_median_ms"]["prefix_plus_denoise"] if vp is not None else None
                diffs = {
                    "folder_vs_lerobot": max_abs(vact, ref),
                    "package_vs_lerobot": max_abs(pact, ref),
                    "folder_vs_package": max_abs(vact, pact),
                    "lerobot_abs_max": float(ref.abs().max()) if ref is not None else None,
                    "all_finite": all(bool(torch.isfinite(a).all()) for a in (vact, pact, ref) if a is not None),
                }
                speed = {
                    "prefix_plus_denoise": ratio(lr_ms, v_ms["prefix_plus_denoise"]),
                    "process_wall": ratio(lr_ms, v_ms["process_wall_ms"]),
                    "package_steady_prefix_plus_denoise": ratio(lr_ms, steady),
                }
                if D != "fp32":
                    diffs["folder_vs_lerobot_fp32"] = max_abs(vact, fp32_ref)
                    diffs["package_vs_lerobot_fp32"] = max_abs(pact, fp32_ref)
                    speed["vs_lerobot_fp32_prefix_plus_denoise"] = ratio(fp32_ms, v_ms["prefix_plus_denoise"])
                    speed["vs_lerobot_fp32_package_steady"] = ratio(fp32_ms, steady)
                row["vlac"][name] = {
                    "env": extra,
                    "folder": vf,
                    "package": vp,
                    "max_abs_diff_action_normalized": diffs,
                    "speedup_lerobot_over_vlac": speed,
                }
                if name != "default":
                    print(f"  {D} T={T} [{name}]: vlac folder {v_ms['prefix_plus_denoise']:.1f} ms "
                          f"x{speed['prefix_plus_denoise'] or 0:.2f}, package steady "
                          f"{steady if steady is None else round(steady, 1)} ms x{speed['package_steady_prefix_plus_denoise'] or 0:.2f}"
                          + (f" (vs lerobot fp32 x{speed['vs_lerobot_fp32_package_steady'] or 0:.2f})" if D != "fp32" else "")
                          + f", max|d| {diffs['package_vs_lerobot'] or 0:.2e}", flush=True)
            block_s = time.perf_counter() - tb
            row["block_seconds"] = block_s
            last_block_s[D] = block_s
            result["per_threads"].append(row)
            srow = summary_row(row, fp32_ms)
            result["summary"].append(srow)
            print(summary_line(srow), flush=True)
            dump()

    result["total_seconds"] = time.perf_counter() - t_start
    dump()
    print(f"wrote {args.out} ({len(result['summary'])} (dtype, T) rows, {result['total_seconds']:.0f} s); summary:")
    for srow in result["summary"]:
        print("  " + summary_line(srow))
    return 0


def pin_process(cpus: list[int]) -> list[int]:
    """Every thread of this process (torch's pool included) onto `cpus`; vlac processes started
    afterwards inherit the mask, so lerobot and vlac run on the very same cores. Returns the cpus."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # a thread that ended meanwhile
    return sorted(os.sched_getaffinity(0))


def interleaved_summary(lr: dict, rounds: list) -> dict:
    """Round i = lerobot's timed chunk i, then at once a vlac package process (--repeat 2, the second
    iteration kept): both see the same load on a shared host, so their ratio is steadier than the
    ratio of medians taken minutes apart."""
    pairs = []
    for r in rounds:
        if "error" in r:
            continue
        l_ms = lr["predict_action_chunk_ms"][r["round"]]
        pairs.append({**r, "lerobot_ms": l_ms, "ratio": l_ms / r["vlac_steady_ms"]})
    out = {"how": "after each timed lerobot chunk, one `vlac run PACKAGE --repeat 2` (steady = 2nd iteration)",
           "rounds": rounds, "pairs": pairs}
    if pairs:
        out["median_ratio"] = median([p["ratio"] for p in pairs])
        out["min_ratio"] = min(p["ratio"] for p in pairs)
        out["max_ratio"] = max(p["ratio"] for p in pairs)
        out["vlac_steady_median_ms"] = median([p["vlac_steady_ms"] for p in pairs])
        out["lerobot_median_ms"] = median([p["lerobot_ms"] for p in pairs])
    return out


def summary_row(row: dict, fp32_ms) -> dict:
    """The headline figures of one (dtype, T) block, default vlac variant."""
    D, lr = row["dtype"], row["lerobot"] or {}
    v = row["vlac"].get("default", {})
    s = {"dtype": D, "threads": row["threads"], "lerobot_ms": lr.get("median_ms"),
         "lerobot_prefix_ms": lr.get("median_prefix_ms"), "lerobot_denoise_ms": lr.get("median_denoise_ms")}
    if "error" in v or not v:
        s["vlac_error"] = v.get("error", "no default variant")
        return s
    fm = v["folder"]["median_ms"]
    pk = (v["package"] or {}).get("steady_median_ms", {})
    sp, d = v["speedup_lerobot_over_vlac"], v["max_abs_diff_action_normalized"]
    s.update({
        "vlac_folder_ms": fm["prefix_plus_denoise"],
        "vlac_folder_prefix_ms": fm["prefix"],
        "vlac_folder_denoise_ms": fm["denoise"],
        "vlac_folder_process_ms": fm["process_wall_ms"],
        "vlac_package_steady_ms": pk.get("prefix_plus_denoise"),
        "speedup_folder": sp["prefix_plus_denoise"],
        "speedup_package": sp["package_steady_prefix_plus_denoise"],
        "max_abs_diff": {"folder": d["folder_vs_lerobot"], "package": d["package_vs_lerobot"]},
    })
    il = row.get("interleaved") or {}
    if "median_ratio" in il:
        s["interleaved_vlac_ms"] = il["vlac_steady_median_ms"]
        s["speedup_interleaved"] = il["median_ratio"]
        s["speedup_interleaved_range"] = [il["min_ratio"], il["max_ratio"]]
    if D != "fp32":
        s["lerobot_fp32_ms"] = fp32_ms
        s["speedup_folder_vs_lerobot_fp32"] = sp["vs_lerobot_fp32_prefix_plus_denoise"]
        s["speedup_package_vs_lerobot_fp32"] = sp["vs_lerobot_fp32_package_steady"]
        s["max_abs_diff"].update({
            "folder_vs_lerobot_fp32": d["folder_vs_lerobot_fp32"],
            "package_vs_lerobot_fp32": d["package_vs_lerobot_fp32"],
            "lerobot_bf16_vs_lerobot_fp32": row.get("lerobot_bf16_vs_lerobot_fp32_max_abs_diff"),
        })
    return s


def summary_line(s: dict) -> str:
    def f(x, fmt=".1f"):
        return "n/a" if x is None else format(x, fmt)

    line = (f"{s['dtype']} T={s['threads']}: lerobot {f(s['lerobot_ms'])} ms "
            f"({f(s['lerobot_prefix_ms'])} + {f(s['lerobot_denoise_ms'])})")
    if "vlac_error" in s:
        return line + f" | vlac failed: {s['vlac_error'][:200]}"
    d = s["max_abs_diff"]
    line += (f" | vlac folder {f(s['vlac_folder_ms'])} ({f(s['vlac_folder_prefix_ms'])} + {f(s['vlac_folder_denoise_ms'])}, "
             f"process {f(s['vlac_folder_process_ms'])}) x{f(s['speedup_folder'], '.2f')}"
             f" | package steady {f(s['vlac_package_steady_ms'])} x{f(s['speedup_package'], '.2f')}"
             f" | max|d| {f(d['folder'], '.2e')} pkg {f(d['package'], '.2e')}")
    if "speedup_interleaved" in s:
        lo, hi = s["speedup_interleaved_range"]
        line += f" | interleaved: vlac {f(s['interleaved_vlac_ms'])} x{f(s['speedup_interleaved'], '.2f')} ({lo:.2f}-{hi:.2f})"
    if s["dtype"] != "fp32":
        line += (f" | vs lerobot fp32 {f(s['lerobot_fp32_ms'])}: x{f(s['speedup_folder_vs_lerobot_fp32'], '.2f')}"
                 f" pkg x{f(s['speedup_package_vs_lerobot_fp32'], '.2f')}, max|d| {f(d['folder_vs_lerobot_fp32'], '.2e')}"
                 f" (lerobot bf16 vs fp32 {f(d['lerobot_bf16_vs_lerobot_fp32'], '.2e')})")
    return line


if __name__ == "__main__":
    sys.exit(main())
