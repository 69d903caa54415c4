#!/usr/bin/env python3
# Makes the CUDA memory-snapshot fixtures of tests/fixtures/snapshots/ with real PyTorch on a GPU:
# one small training loop per memory shape. Needs torch with CUDA; writes only into --out.
"""Generate memory snapshots that show each shape `vlac mem snapshot` must recognise.

Scenarios (each runs in its own process, so the allocator starts empty):
  steady      weights + AdamW state dominate; model built and warmed up BEFORE recording,
              so the flat part is only visible through `segments` (pre-recording memory).
  activations small weights, big batch, deep stack: per-step sawtooth dominates.
  leak        every step appends the loss WITH its graph to a list (`history.append(loss)`
              in `leaky_train_step`): the saved activations of every step stay alive.
  oom         a per-process memory fraction caps the allocator; a step with a huge batch
              dies with torch.OutOfMemoryError (the trace gets an `oom` entry).
  noprofile   no history recording at all: `device_traces` is empty, only `segments`.

Usage: python3 tools/make_memory_snapshots.py --out DIR [--scenario NAME] [--max-entries N]
Also writes DIR/truth.json (torch's own peak counters for each scenario) and, with
--opcodes, DIR/opcodes.txt (pickletools opcode counts of each file).
"""
import argparse
import collections
import json
import os
import pickletools
import subprocess
import sys

MAX_FILE_BYTES = 2 * 1024 * 1024
SCENARIOS = ["steady", "activations", "leak", "oom", "noprofile"]


def start_recording(torch, max_entries):
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                             max_entries=max_entries)


def make_weights(torch, n_layers, width, device="cuda"):
    return [torch.nn.Parameter(torch.randn(width, width, device=device) * (width ** -0.5))
            for _ in range(n_layers)]


def train_step(torch, weights, opt, x, y):
    h = x
    for w in weights:
        h = torch.relu(h @ w)
    loss = torch.nn.functional.mse_loss(h, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def activation_train_step(torch, weights, opt, x, y):
    # Deep stack at a big batch: every layer saves its [B, D] input and output for backward.
    h = x
    for w in weights:
        h = torch.relu(h @ w)
    loss = torch.nn.functional.mse_loss(h, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def leaky_train_step(torch, weights, opt, x, y, history):
    h = x
    for w in weights:
        h = torch.relu(h @ w)  # activations saved for backward, kept alive by history
    loss = torch.nn.functional.mse_loss(h, y)
    loss.backward(retain_graph=True)  # "fixes" a double-backward error; keeps saved tensors
    opt.step()
    opt.zero_grad(set_to_none=True)
    history.append(loss)  # THE LEAK: the loss keeps its whole graph (and saved activations)
    return loss


def run_scenario(name, out_dir, max_entries):
    import torch
    torch.manual_seed(0)
    dev = "cuda"
    truth = {"scenario": name, "torch": torch.__version__, "max_entries": max_entries}
    path = os.path.join(out_dir, f"{name}.pickle")
    if name == "steady":
        # 8 x [2048, 2048] fp32 = 128 MiB weights, 256 MiB Adam state; batch 16: tiny activations.
        weights = make_weights(torch, 8, 2048)
        opt = torch.optim.AdamW(weights, lr=1e-4)
        x = torch.randn(16, 2048, device=dev)
        y = torch.randn(16, 2048, device=dev)
        train_step(torch, weights, opt, x, y)  # warm-up: Adam state exists before recording
        torch.cuda.synchronize()
        start_recording(torch, max_entries)
        for _ in range(6):
            train_step(torch, weights, opt, x, y)
    elif name == "activations":
        # 16 x [1024, 1024] = 64 MiB weights; batch 8192: 32 MiB per [B, D] activation.
        start_recording(torch, max_entries)
        weights = make_weights(torch, 16, 1024)
        opt = torch.optim.AdamW(weights, lr=1e-4)
        x = torch.randn(8192, 1024, device=dev)
        y = torch.randn(8192, 1024, device=dev)
        for _ in range(6):
            activation_train_step(torch, weights, opt, x, y)
    elif name == "leak":
        # 4 x [1024, 1024] = 16 MiB weights; batch 2048: 8 MiB per activation, ~64 MiB a step leaked.
        start_recording(torch, max_entries)
        weights = make_weights(torch, 4, 1024)
        opt = torch.optim.AdamW(weights, lr=1e-4)
        x = torch.randn(2048, 1024, device=dev)
        y = torch.randn(2048, 1024, device=dev)
        history = []
        for _ in range(8):
            leaky_train_step(torch, weights, opt, x, y, history)
        truth["leaked_steps"] = len(history)
    elif name == "oom":
        total = torch.cuda.get_device_properties(0).total_memory
        fraction = (2 * 1024 ** 3) / total  # allow ~2 GiB
        torch.cuda.set_per_process_memory_fraction(fraction)
        truth["allowed_bytes"] = int(total * fraction)
        start_recording(torch, max_entries)
        weights = make_weights(torch, 6, 1024)
        opt = torch.optim.AdamW(weights, lr=1e-4)
        for batch in (1024, 1024, 1024, 131072):  # the last step: 512 MiB per activation
            try:
                x = torch.randn(batch, 1024, device=dev)
                y = torch.randn(batch, 1024, device=dev)
                train_step(torch, weights, opt, x, y)
                del x, y
            except torch.OutOfMemoryError as e:
                truth["oom_message"] = str(e).splitlines()[0]
                break
    elif name == "noprofile":
        weights = make_weights(torch, 4, 1024)
        opt = torch.optim.AdamW(weights, lr=1e-4)
        x = torch.randn(256, 1024, device=dev)
        y = torch.randn(256, 1024, device=dev)
        torch.cuda.reset_peak_memory_stats()
        for _ in range(3):
            train_step(torch, weights, opt, x, y)
    else:
        raise SystemExit(f"unknown scenario {name}")
    torch.cuda.synchronize()
    truth["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    truth["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    truth["memory_allocated_at_dump"] = torch.cuda.memory_allocated()
    truth["memory_reserved_at_dump"] = torch.cuda.memory_reserved()
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    truth["file_bytes"] = os.path.getsize(path)
    return truth


def opcode_counts(path):
    with open(path, "rb") as f:
        data = f.read()
    counts = collections.Counter(op.name for op, _, _ in pickletools.genops(data))
    proto = data[1] if len(data) > 1 and data[0] == 0x80 else None
    return proto, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenario", choices=SCENARIOS)
    ap.add_argument("--max-entries", type=int, default=20000)
    ap.add_argument("--opcodes", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.scenario:  # child process: one scenario, truth on stdout
        print("TRUTH " + json.dumps(run_scenario(args.scenario, args.out, args.max_entries)))
        return
    truths = {}
    for name in SCENARIOS:
        entries = args.max_entries
        while True:
            r = subprocess.run([sys.executable, __file__, "--out", args.out, "--scenario", name,
                                "--max-entries", str(entries)], capture_output=True, text=True)
            sys.stderr.write(r.stderr[-2000:])
            if r.returncode != 0:
                raise SystemExit(f"{name}: exit {r.returncode}")
            truth = json.loads([l for l in r.stdout.splitlines() if l.startswith("TRUTH ")][-1][6:])
            if truth["file_bytes"] <= MAX_FILE_BYTES or entries <= 500:
                break
            entries //= 2  # keep fixtures small: a shorter ring buffer keeps only the last events
        truths[name] = truth
        print(f"{name}: {truth['file_bytes']} bytes, max_entries {entries}, "
              f"peak allocated {truth['max_memory_allocated']}", flush=True)
    with open(os.path.join(args.out, "truth.json"), "w") as f:
        json.dump(truths, f, indent=1, sort_keys=True)
    if args.opcodes:
        with open(os.path.join(args.out, "opcodes.txt"), "w") as f:
            for name in SCENARIOS:
                proto, counts = opcode_counts(os.path.join(args.out, f"{name}.pickle"))
                f.write(f"{name}: protocol {proto}: " +
                        ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) + "\n")


if __name__ == "__main__":
    main()
