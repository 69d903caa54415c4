#!/usr/bin/env python3
"""Measure GPU memory of real training steps of lerobot's own policies (issue 16).

Every configuration runs in its own process (``--run NAME``): the policy is built from its config
with random weights at full size (no hub download: PaliGemma/Gemma, the SmolVLM2 backbone and
GR00T N1.7's Cosmos-Reason2/Qwen3-VL backbone are constructed from local configs), moved to the
GPU, and trained for 5 steps on random batches of the real shapes: forward, backward, gradient
clipping and the optimizer step of the policy's own preset (``config.get_optimizer_preset()`` ->
``torch.optim.AdamW`` with lerobot's settings), then ``zero_grad()`` -- the body of lerobot's
``update_policy`` without the accelerator (which, with mixed_precision="no" on one GPU, only calls
``loss.backward()``).

Recorded per phase with ``torch.cuda.reset_peak_memory_stats()`` between phases:
  load       model on the GPU (allocated / reserved after, and the construction peak)
  forward    first forward (peak, and what stays allocated: the activations kept for backward)
  backward   first backward
  optimizer  first clip + optimizer.step() + zero_grad() (AdamW's state is created lazily here)
  steps      steps 2..5, whole training steps
plus ``torch.cuda.mem_get_info`` (what the driver sees: context + libraries + torch's reserve) and
a ``torch.cuda.memory._dump_snapshot`` of the 5 steps (history recorded with a bounded ring
buffer, python stacks only, so the pickle stays a few MB).

Driver mode (no ``--run``) runs the named configurations, each in a subprocess, several at a time
while their estimated peaks fit the card, writes one JSON with versions and the exact commands,
and packs the snapshots into one tar.xz.

Patches (documented, applied at import, never editing lerobot):
  * ``create_causal_mask``: lerobot 0.6.1's PiGemmaModel passes ``cache_position=``, which
    transformers 5.17's ``masking_utils.create_causal_mask`` no longer takes; the wrapper drops the
    argument when the installed signature has no such parameter (only the prefix-only/suffix-only
    inference path calls it; training runs the joint layers, which build no mask).
  * SmolVLA: ``AutoConfig.from_pretrained`` / ``AutoProcessor.from_pretrained`` of
    ``HuggingFaceTB/SmolVLM2-500M-Video-Instruct`` are answered locally inside lerobot's
    ``smolvlm_with_expert`` module: a ``SmolVLMConfig`` built from the published sizes (SigLIP
    768x12 at 512 px / patch 16, SmolLM2 960x32 GQA 15/5, vocab 49280, pixel shuffle 4) and a
    stand-in processor whose tokenizer carries the two special-token ids SmolVLA reads.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import platform
import shlex
import subprocess
import sys
import tarfile
import time
import traceback

# ---- configurations ------------------------------------------------------------------------

# name -> settings. est_gib: rough peak used only to decide how many run at once.
CONFIGS: dict[str, dict] = {}


def _add(name, policy, batch, est_gib, **kw):
    CONFIGS[name] = dict(policy=policy, batch=batch, est_gib=est_gib, **kw)


_add("act_b8", "act", 8, 4)
_add("act_b64", "act", 64, 17)
for b, e32, e16 in ((1, 67, 40), (4, 82, 50), (8, 110, 73)):
    _add(f"pi05_fp32_b{b}", "pi05", b, e32, dtype="float32")
    _add(f"pi05_bf16_b{b}", "pi05", b, e16, dtype="bfloat16")
_add("pi05_fp32_b8_gc", "pi05", 8, 68, dtype="float32", gradient_checkpointing=True)
_add("pi05_bf16_b8_gc", "pi05", 8, 36, dtype="bfloat16", gradient_checkpointing=True)
_add("pi05_bf16_b8_freezevis", "pi05", 8, 57, dtype="bfloat16", freeze_vision_encoder=True)
_add("pi05_bf16_b8_expertonly", "pi05", 8, 39, dtype="bfloat16", train_expert_only=True)
_add("pi05_bf16_b8_lora", "pi05", 8, 37, dtype="bfloat16", lora=True)
_add("pi05_fp32_b8_expertonly", "pi05", 8, 58, dtype="float32", train_expert_only=True)
_add("smolvla_b8", "smolvla", 8, 7)
_add("smolvla_b64", "smolvla", 64, 26)
_add("smolvla_b64_vlmbf16", "smolvla", 64, 23, vlm_bf16=True)
_add("groot_b32", "groot", 32, 41)
_add("groot_b64", "groot", 64, 43)
_add("groot_b32_tunevl", "groot", 32, 69, tune_llm=True, tune_visual=True)
# A deliberate leak (issue 16, the analyser's staircase on a real run): backward(retain_graph=True)
# and the loss kept in a list each step, so every step's saved activations stay alive.
_add("act_b8_leak", "act", 8, 12, leak="retain_graph")

# Snapshots shipped as test fixtures (tests/fixtures/snapshots/measured_*.pickle.xz): the trace is
# cut to its last N events, exactly what a ring buffer of max_entries=N would have kept.
FIXTURE_ENTRIES = {"act_b8": 40_000, "act_b64": 40_000, "act_b8_leak": 40_000, "smolvla_b8": 120_000,
                   "pi05_bf16_b1": 150_000}

STEPS = int(os.environ.get("VLAC_MEASURE_STEPS", "5"))
# Off-GPU check of the code paths only (this project's CPU machine): VLAC_MEASURE_DEVICE=cpu and
# VLAC_MEASURE_TINY=1 shrink the models; numbers from such a run mean nothing.
DEVICE = os.environ.get("VLAC_MEASURE_DEVICE", "cuda")
TINY = os.environ.get("VLAC_MEASURE_TINY") == "1"
MAX_ENTRIES = int(os.environ.get("VLAC_MEASURE_MAX_ENTRIES", "250000"))
# With gradient checkpointing, the first measuring call (torch 2.11, python stacks recorded)
# failed inside backward with "SystemError: run_backward returned NULL without setting an
# exception" while the recomputation ran under the memory-history recorder; those runs record
# no history (the counters are unaffected).
NO_RECORD_WHY = "gradient checkpointing + _record_memory_history failed in backward"  # snapshot ring buffer (alloc/free events); bounds the pickle size


# ---- patches -------------------------------------------------------------------------------

def patch_create_causal_mask():
    import transformers.masking_utils as mu
    from lerobot.policies import pi_gemma
    orig = mu.create_causal_mask
    if "cache_position" in inspect.signature(orig).parameters:
        return False

    def create_causal_mask(*args, cache_position=None, **kwargs):  # noqa: ARG001
        return orig(*args, **kwargs)

    pi_gemma.create_causal_mask = create_causal_mask
    return True


def smolvlm2_500m_config():
    from transformers import SmolVLMConfig
    return SmolVLMConfig(
        image_token_id=49190,
        scale_factor=4,
        tie_word_embeddings=False,
        vocab_size=49280,
        text_config=dict(
            model_type="llama", hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
            num_attention_heads=15, num_key_value_heads=5, head_dim=64, vocab_size=49280,
            rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
            tie_word_embeddings=False, hidden_act="silu"),
        vision_config=dict(
            model_type="smolvlm_vision", hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
            num_attention_heads=12, image_size=512, patch_size=16, num_channels=3),
    )


def patch_smolvlm_hub():
    from lerobot.policies.smolvla import smolvlm_with_expert as swe

    class _Tok:
        fake_image_token_id = 49189   # <fake_token_around_image>
        global_image_token_id = 49152  # <global-img>

    class _Proc:
        tokenizer = _Tok()

    class _AutoConfig:
        @staticmethod
        def from_pretrained(*_a, **_k):
            return smolvlm2_500m_config()

    class _AutoProcessor:
        @staticmethod
        def from_pretrained(*_a, **_k):
            return _Proc()

    swe.AutoConfig = _AutoConfig
    swe.AutoProcessor = _AutoProcessor


# ---- policies and batches ------------------------------------------------------------------

def build(cfg):
    """Returns (module to train, optimizer params, grad clip norm, batch fn, loss fn, meta)."""
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.utils.constants import (ACTION, OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS,
                                         OBS_STATE)
    dev = torch.device(DEVICE)
    B = cfg["batch"] if not TINY else 1
    if TINY:
        shrink_for_cpu_check(cfg["policy"])
    meta = {}
    pol = cfg["policy"]
    if pol == "act":
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy
        c = ACTConfig(
            input_features={"observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 480, 640)),
                            OBS_STATE: PolicyFeature(FeatureType.STATE, (14,))},
            output_features={ACTION: PolicyFeature(FeatureType.ACTION, (14,))},
            pretrained_backbone_weights=None,  # torchvision download otherwise; random init, same size
            device=DEVICE)
        with dev:
            policy = ACTPolicy(c)
        policy.to(dev)
        meta["inputs"] = dict(cams=1, image="480x640", chunk=c.chunk_size, state=14, action=14)

        def batch():
            return {"observation.images.top": torch.rand(B, 3, 480, 640, device=dev),
                    OBS_STATE: torch.randn(B, 14, device=dev),
                    ACTION: torch.randn(B, c.chunk_size, 14, device=dev),
                    "action_is_pad": torch.zeros(B, c.chunk_size, dtype=torch.bool, device=dev)}
        loss_fn = lambda m, b: m.forward(b)[0]  # noqa: E731
        opt_cfg = c.get_optimizer_preset()
        params = policy.get_optim_params()
    elif pol == "pi05":
        meta["patched_create_causal_mask"] = patch_create_causal_mask()
        from lerobot.policies.pi05.configuration_pi05 import PI05Config
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy
        cams = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
        c = PI05Config(
            input_features={f"observation.images.{k}": PolicyFeature(FeatureType.VISUAL, (3, 224, 224)) for k in cams},
            output_features={ACTION: PolicyFeature(FeatureType.ACTION, (32,))},
            dtype=cfg.get("dtype", "float32"),
            gradient_checkpointing=cfg.get("gradient_checkpointing", False),
            freeze_vision_encoder=cfg.get("freeze_vision_encoder", False),
            train_expert_only=cfg.get("train_expert_only", False),
            device=DEVICE)
        with dev:
            policy = PI05Policy(c)
        L = c.tokenizer_max_length
        meta["inputs"] = dict(cams=3, image="224x224", prompt=L, chunk=c.chunk_size, action=32)
        opt_cfg = c.get_optimizer_preset()
        if cfg.get("lora"):
            from lerobot.configs.default import PeftConfig
            # wrap_with_peft refuses a policy without pretrained_path (training adapters from
            # scratch); the memory is the same with random weights, so name the hub checkpoint a
            # real run would start from (nothing is downloaded).
            c.pretrained_path = "lerobot/pi05_base"
            policy = policy.wrap_with_peft(peft_cli_overrides=dataclasses.asdict(PeftConfig()))
            meta["peft"] = dataclasses.asdict(PeftConfig())
            meta["peft_targets"] = str(policy.peft_config["default"].target_modules)

        def batch():
            b = {f"observation.images.{k}": torch.rand(B, 3, 224, 224, device=dev) for k in cams}
            b[OBS_LANGUAGE_TOKENS] = torch.randint(0, 257152, (B, L), device=dev)
            b[OBS_LANGUAGE_ATTENTION_MASK] = torch.ones(B, L, dtype=torch.bool, device=dev)
            b[ACTION] = torch.randn(B, c.chunk_size, 32, device=dev)
            return b
        loss_fn = lambda m, b: m.forward(b)[0]  # noqa: E731
        params = policy.get_optim_params()
    elif pol == "smolvla":
        patch_smolvlm_hub()
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
        cams = ["camera1", "camera2", "camera3"]
        c = SmolVLAConfig(
            input_features={**{f"observation.images.{k}": PolicyFeature(FeatureType.VISUAL, (3, 512, 512)) for k in cams},
                            OBS_STATE: PolicyFeature(FeatureType.STATE, (32,))},
            output_features={ACTION: PolicyFeature(FeatureType.ACTION, (32,))},
            device=DEVICE)
        with dev:
            policy = SmolVLAPolicy(c)
        if cfg.get("vlm_bf16"):
            # What load_vlm_weights=True leaves: AutoModelForImageTextToText.from_pretrained(
            # torch_dtype="bfloat16") -> the whole SmolVLM2 in bf16, the expert as built.
            policy.model.vlm_with_expert.vlm.to(torch.bfloat16)
        policy.to(dev)
        L = c.tokenizer_max_length
        meta["inputs"] = dict(cams=3, image="512x512", prompt=L, chunk=c.chunk_size, state=32, action=32,
                              load_vlm_weights=c.load_vlm_weights, vlm_bf16=bool(cfg.get("vlm_bf16")))

        def batch():
            b = {f"observation.images.{k}": torch.rand(B, 3, 512, 512, device=dev) for k in cams}
            b[OBS_STATE] = torch.randn(B, 32, device=dev)
            b[OBS_LANGUAGE_TOKENS] = torch.randint(0, 49000, (B, L), device=dev)
            b[OBS_LANGUAGE_ATTENTION_MASK] = torch.ones(B, L, dtype=torch.bool, device=dev)
            b[ACTION] = torch.randn(B, c.chunk_size, 32, device=dev)
            return b
        loss_fn = lambda m, b: m.forward(b)[0]  # noqa: E731
        opt_cfg = c.get_optimizer_preset()
        params = policy.get_optim_params()
    elif pol == "groot":
        # lerobot 0.6.1's own GR00T N1.7 port (policies/groot/groot_n1_7.py), built from
        # GR00TN17Config's defaults with load_backbone_weights=False: the backbone is
        # Qwen3VLForConditionalGeneration._from_config(<hard-coded Cosmos-Reason2-2B config>),
        # truncated to select_layer layers. Then, as GrootPolicy does with model_params_fp32=True
        # (and Isaac-GR00T's launcher with load_bf16=False), every parameter in fp32; forward
        # under bf16 autocast (use_bf16=True).
        from lerobot.policies.groot.configuration_groot import GrootConfig
        from lerobot.policies.groot.groot_n1_7 import GR00TN17, GR00TN17Config
        from transformers.feature_extraction_utils import BatchFeature
        gc = GrootConfig.__dataclass_fields__
        mc = GR00TN17Config(tune_llm=cfg.get("tune_llm", False), tune_visual=cfg.get("tune_visual", False))
        with dev:
            model = GR00TN17(mc, load_backbone_weights=False)
        for p in model.parameters():
            if p.is_floating_point():
                p.data = p.data.to(torch.float32)
        model.to(dev)
        policy = model
        H, A, S = mc.action_horizon, mc.max_action_dim, mc.max_state_dim
        img_tok, grid, text = 64, (1, 16, 16), 62  # 256x256 image -> 16x16 patches -> 2x2 merge -> 64
        qcfg = model.backbone.model.config
        seq = 1 + img_tok + 1 + text
        meta["inputs"] = dict(cams=1, image="256x256", image_tokens=img_tok, seq=seq, chunk=H, state=S, action=A,
                              select_layer=mc.select_layer, tune_llm=mc.tune_llm, tune_visual=mc.tune_visual)

        def batch():
            ids = torch.randint(0, 150000, (B, seq), device=dev)
            ids[:, 0] = qcfg.vision_start_token_id
            ids[:, 1:1 + img_tok] = qcfg.image_token_id
            ids[:, 1 + img_tok] = qcfg.vision_end_token_id
            npatch = grid[0] * grid[1] * grid[2]
            bb = BatchFeature(data={
                "input_ids": ids, "attention_mask": torch.ones(B, seq, dtype=torch.long, device=dev),
                "pixel_values": torch.randn(B * npatch, 3 * 2 * 16 * 16, device=dev),
                "image_grid_thw": torch.tensor([grid] * B, device=dev)})
            ab = BatchFeature(data={
                "state": torch.randn(B, 1, S, device=dev), "action": torch.randn(B, H, A, device=dev),
                "action_mask": torch.ones(B, H, A, device=dev),
                "embodiment_id": torch.zeros(B, dtype=torch.long, device=dev)})
            return (bb, ab)

        def loss_fn(m, b):
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                out = m.backbone(b[0])
                return m.action_head(out, b[1])["loss"]
        from lerobot.optim.optimizers import AdamWConfig
        d = {k: gc[k].default for k in ("optimizer_lr", "optimizer_betas", "optimizer_eps", "optimizer_weight_decay")}
        opt_cfg = AdamWConfig(lr=d["optimizer_lr"], betas=d["optimizer_betas"], eps=d["optimizer_eps"],
                              weight_decay=d["optimizer_weight_decay"], grad_clip_norm=1.0)
        params = [p for p in model.parameters() if p.requires_grad]
        meta["groot_config"] = {k: getattr(mc, k) for k in ("select_layer", "load_bf16", "backbone_trainable_params_fp32",
                                                             "tune_projector", "tune_diffusion_model", "tune_vlln")}
    else:
        raise ValueError(pol)
    return policy, params, opt_cfg, batch, loss_fn, meta


def param_census(model):
    import torch
    out = {}
    for n, p in model.named_parameters():
        k = f"{str(p.dtype).replace('torch.', '')}/{'trainable' if p.requires_grad else 'frozen'}"
        out[k] = out.get(k, 0) + p.numel()
    bufs = sum(b.numel() * b.element_size() for b in model.buffers())
    return {"params": out, "buffer_bytes": bufs,
            "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "total_params": sum(p.numel() for p in model.parameters())}


def shrink_for_cpu_check(policy):
    if policy == "pi05":
        from lerobot.policies.pi05 import modeling_pi05 as m
        orig = m.get_gemma_config

        def tiny(variant):
            c = orig(variant)
            c.depth = 2
            return c
        m.get_gemma_config = tiny
    elif policy == "groot":
        from lerobot.policies.groot import groot_n1_7 as g
        g.GR00T_N1_7_DEFAULTS["select_layer"] = 2
        g.GR00T_N1_7_DEFAULTS["diffusion_model_cfg"]["num_layers"] = 2
        orig = g._cosmos_reason2_qwen3_vl_config

        def small():
            c = orig()
            c.vision_config.depth = 4
            c.vision_config.deepstack_visual_indexes = [1, 2, 3]
            return c
        g._cosmos_reason2_qwen3_vl_config = small


# The caching allocator's own counters, per phase (issue 16: where peak reserved comes from).
ALLOC_STATS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "segment.all.current",
               "segment.large_pool.current", "segment.small_pool.current", "reserved_bytes.large_pool.current",
               "reserved_bytes.small_pool.current", "reserved_bytes.small_pool.peak", "allocated_bytes.small_pool.peak",
               "allocated_bytes.large_pool.peak", "inactive_split_bytes.all.current", "inactive_split_bytes.all.peak",
               "inactive_split_bytes.large_pool.current", "inactive_split_bytes.small_pool.current",
               "requested_bytes.all.peak", "oversize_allocations.current")

MIB = 2 ** 20


class SavedCensus:
    """What the first forward saves for backward, by module: every tensor autograd packs
    (torch.autograd.graph.saved_tensors_hooks, identity hooks), counted once per storage and
    charged to the innermost module running when it was first saved; parameters are skipped.
    Keys are module paths with layer indices replaced by '*'."""

    def __init__(self, model):
        import torch
        self.torch = torch
        self.names = {id(m): n for n, m in model.named_modules()}
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.stack = [""]
        self.seen = {}
        self.by = {}

    def _pre(self, mod, _inp):
        self.stack.append(self.names.get(id(mod), self.stack[-1]))

    def _post(self, _mod, _inp, _out):
        if len(self.stack) > 1:
            self.stack.pop()

    def _pack(self, t):
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr and ptr not in self.params and ptr not in self.seen and t.device.type != "cpu":
                path = ".".join("*" if x.isdigit() else x for x in self.stack[-1].split("."))
                self.seen[ptr] = path
                key = (path, str(t.dtype).replace("torch.", ""), tuple(t.shape))
                e = self.by.setdefault(key, [0, 0])
                e[0] += st.nbytes()
                e[1] += 1
        except Exception:  # noqa: BLE001
            pass
        return t

    def __enter__(self):
        from torch.nn.modules import module as mm
        self.h1 = mm.register_module_forward_pre_hook(self._pre)
        self.h2 = mm.register_module_forward_hook(self._post)
        self.ctx = self.torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.ctx.__enter__()
        return self

    def __exit__(self, *a):
        self.ctx.__exit__(*a)
        self.h1.remove()
        self.h2.remove()

    def result(self):
        by_module = {}
        for (path, dt, shape), (nb, cnt) in self.by.items():
            m = by_module.setdefault(path, {"bytes": 0, "tensors": 0, "by_dtype": {}})
            m["bytes"] += nb
            m["tensors"] += cnt
            m["by_dtype"][dt] = m["by_dtype"].get(dt, 0) + nb
        top = sorted(self.by.items(), key=lambda kv: -kv[1][0])[:400]
        return {"total_bytes": sum(v[0] for v in self.by.values()), "by_module": by_module,
                "top": [[p, dt, list(sh), nb, cnt] for (p, dt, sh), (nb, cnt) in top]}


def segment_summary(segments):
    """Reserved memory at a moment, by pool: segments, their sizes, the free (inactive) bytes
    inside them and the largest free block -- what fragmentation holds."""
    out = {}
    for sg in segments:
        pool = sg.get("segment_type", "?")
        o = out.setdefault(pool, {"segments": 0, "reserved": 0, "allocated": 0, "inactive": 0,
                                  "largest_inactive": 0, "inactive_hist": {}, "segment_sizes": {}})
        o["segments"] += 1
        o["reserved"] += sg["total_size"]
        o["allocated"] += sg.get("allocated_size", 0)
        sz = sg["total_size"]
        o["segment_sizes"][str(sz)] = o["segment_sizes"].get(str(sz), 0) + 1
        for bl in sg["blocks"]:
            if bl["state"] == "inactive":
                o["inactive"] += bl["size"]
                o["largest_inactive"] = max(o["largest_inactive"], bl["size"])
                bucket = next(x for x in (1, 2, 10, 20, 100, 1000, 10 ** 9) if bl["size"] <= x * MIB)
                o["inactive_hist"][f"<={bucket}MiB"] = o["inactive_hist"].get(f"<={bucket}MiB", 0) + bl["size"]
    for o in out.values():  # keep the JSON small: the 40 most common segment sizes
        o["segment_sizes"] = dict(sorted(o["segment_sizes"].items(), key=lambda kv: -kv[1])[:40])
    return out


def user_site(frames):
    for f in frames or []:
        fn = f.get("filename", "")
        if "/torch/" in fn or fn.startswith("<") or "measure_train_memory" in fn:
            continue
        return f"{os.path.basename(fn)}:{f.get('line')} {f.get('name')}"
    return "(no python frame: autograd engine / C++)" if not frames else "(torch internals)"


def segment_growth(snap):
    """Every cudaMalloc of the recorded window (segment_alloc), charged to the phase it fell in
    (the vlac:forward#k / backward#k / optimizer#k annotations) and the allocation that caused it:
    where peak reserved grows beyond peak allocated."""
    tr = (snap.get("device_traces") or [[]])[0]
    marks = []
    for a in snap.get("external_annotations", []) or []:
        n = a.get("name", "")
        if n.startswith("vlac:") and a.get("stage") == "START":
            marks.append((a["time_us"], n[5:]))
    marks.sort()

    def phase_of(t):
        ph = "before"
        for tm, n in marks:
            if tm <= t:
                ph = n
            else:
                break
        return ph
    rows = {}
    for i, e in enumerate(tr):
        if e["action"] != "segment_alloc":
            continue
        trig = next((x for x in tr[i + 1:i + 4] if x["action"] == "alloc"), None)
        ph = phase_of(e.get("time_us", 0))
        site = user_site(trig.get("frames") if trig else e.get("frames"))
        key = (ph, site)
        r = rows.setdefault(key, [0, 0, 0])
        r[0] += e["size"]
        r[1] += 1
        r[2] = max(r[2], trig["size"] if trig else 0)
    by_phase = {}
    for (ph, _), (b, c, _) in rows.items():
        q = by_phase.setdefault(ph, [0, 0])
        q[0] += b
        q[1] += c
    top = sorted(rows.items(), key=lambda kv: -kv[1][0])[:60]
    return {"window_events": len(tr), "first_time_us": tr[0].get("time_us") if tr else None,
            "marks": [[t, n] for t, n in marks],
            "by_phase": {k: {"bytes": v[0], "segments": v[1]} for k, v in by_phase.items()},
            "top": [[ph, site, b, c, mx] for (ph, site), (b, c, mx) in top]}


# Configurations whose raw allocator trace comes back (no stacks): the block layout when
# recording began, then every alloc/free/segment event -- enough to replay the caching allocator.
TRACE_CONFIGS = ("act_b64", "pi05_bf16_b8_expertonly", "pi05_fp32_b4", "groot_b32", "pi05_bf16_b8_lora",
                 "smolvla_b8")
TRACE_ACTIONS = {"alloc": 1, "free_requested": 2, "free_completed": 3, "segment_alloc": 4, "segment_free": 5,
                 "oom": 6, "snapshot": 7, "segment_map": 8, "segment_unmap": 9}


def write_compact_trace(snap, start_segments, path):
    """xz of: a JSON header line (segments when recording began, as [address, size, [[block
    address, size, state], ...]], and the vlac:* annotations), then one '<BQQq' record per event
    (action, address, size, time_us)."""
    import lzma
    import struct
    segs = [[sg["address"], sg["total_size"], sg.get("segment_type", ""),
             [[b["address"], b["size"], b["state"]] for b in sg["blocks"]]] for sg in (start_segments or [])]
    ann = [[a.get("name"), a.get("stage"), a.get("time_us")] for a in snap.get("external_annotations", []) or []]
    head = json.dumps({"segments_at_start": segs, "annotations": ann}).encode() + b"\n"
    rec = struct.Struct("<BQQq")
    body = b"".join(rec.pack(TRACE_ACTIONS.get(e["action"], 0), e.get("addr", 0) or 0, e.get("size", 0) or 0,
                             e.get("time_us", 0) or 0) for e in (snap.get("device_traces") or [[]])[0])
    with open(path, "wb") as f:
        f.write(lzma.compress(head + body, preset=6))


def run_vlac(path):
    """vlac's own snapshot analyser (`vlac mem snapshot --json`) on one pickle, if a binary was
    given (VLAC_BIN, libraries in VLAC_LIB); the timeline is dropped to keep the JSON small."""
    vb = os.environ.get("VLAC_BIN")
    if not vb:
        return None
    env = dict(os.environ)
    if os.environ.get("VLAC_LIB"):
        env["LD_LIBRARY_PATH"] = os.environ["VLAC_LIB"] + ":" + env.get("LD_LIBRARY_PATH", "")
    t0 = time.time()
    p = subprocess.run([vb, "mem", "snapshot", path, "--json", "--top", "12"], capture_output=True, text=True,
                       env=env, timeout=120)
    out = {"rc": p.returncode, "seconds": round(time.time() - t0, 2), "stderr": p.stderr[-600:]}
    try:
        j = json.loads(p.stdout)
        j.pop("timeline", None)
        out["json"] = j
    except Exception as e:  # noqa: BLE001
        out["parse_error"] = repr(e)[:300]
        out["stdout_tail"] = p.stdout[-600:]
    return out


def postprocess_snapshot(snap, name, out_dir, res):
    """Dumps the snapshot, runs vlac on it, records where reserved grew, and for the fixture
    configurations also writes the trace cut to its last N events, xz-compressed."""
    import lzma
    import pickle
    try:
        res["segment_growth"] = segment_growth(snap)
    except Exception as e:  # noqa: BLE001
        res["segment_growth"] = {"error": repr(e)[:300]}
    path = os.path.join(out_dir, f"{name}.pickle")
    with open(path, "wb") as f:
        pickle.dump(snap, f)  # what torch.cuda.memory._dump_snapshot writes
    res["snapshot"] = os.path.basename(path)
    res["snapshot_bytes"] = os.path.getsize(path)
    res["snapshot_events"] = len((snap.get("device_traces") or [[]])[0])
    try:
        res["vlac"] = run_vlac(path)
    except Exception as e:  # noqa: BLE001
        res["vlac"] = {"error": repr(e)[:300]}
    keep = FIXTURE_ENTRIES.get(name)
    if keep:
        try:
            cut = dict(snap)
            cut["device_traces"] = [t[-keep:] for t in snap["device_traces"]]
            tpath = os.path.join(out_dir, f"measured_{name}.pickle")
            with open(tpath, "wb") as f:
                pickle.dump(cut, f)
            res["fixture_vlac"] = run_vlac(tpath)
            with open(tpath, "rb") as f, open(tpath + ".xz", "wb") as g:
                g.write(lzma.compress(f.read(), preset=6))
            res["fixture"] = {"file": os.path.basename(tpath) + ".xz", "entries": keep,
                              "pickle_bytes": os.path.getsize(tpath), "xz_bytes": os.path.getsize(tpath + ".xz")}
            os.remove(tpath)
        except Exception as e:  # noqa: BLE001
            res["fixture"] = {"error": repr(e)[:300]}
    if os.environ.get("VLAC_MEASURE_KEEP_PICKLES") != "1":
        os.remove(path)


class _CpuMem:
    @staticmethod
    def zero(*_a, **_k):
        return 0


def fake_run(name, out_dir):
    """VLAC_MEASURE_FAKE=SNAPSHOT.pickle: no torch; a recorded snapshot stands in for the run, so
    the driver, vlac's analysis, the fixture cut and the packing can be checked off the GPU."""
    import pickle
    with open(os.environ["VLAC_MEASURE_FAKE"], "rb") as f:
        snap = pickle.load(f)
    res = {"name": name, "config": {k: v for k, v in CONFIGS[name].items() if k != "est_gib"}, "ok": True,
           "fake": True, "phases": {}, "peak_allocated": 0, "peak_reserved": 0}
    res["segments_end"] = segment_summary(snap["segments"])
    if name in TRACE_CONFIGS:
        write_compact_trace(snap, snap["segments"], os.path.join(out_dir, f"trace_{name}.bin.xz"))
    postprocess_snapshot(snap, name, out_dir, res)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res.get(k) for k in ("name", "ok")}), flush=True)


def run_one(name, out_dir):
    if os.environ.get("VLAC_MEASURE_FAKE"):
        return fake_run(name, out_dir)
    import torch
    if DEVICE == "cpu":  # code-path check only
        for f in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
            setattr(torch.cuda, f, _CpuMem.zero)
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.reset_peak_memory_stats = lambda *a, **k: None
        torch.cuda.init = lambda: None
        torch.cuda.mem_get_info = lambda *a, **k: (0, 0)
        torch.cuda.memory._record_memory_history = lambda *a, **k: None
        torch.cuda.memory._dump_snapshot = lambda path: open(path, "wb").close()
    cfg = CONFIGS[name]
    res = {"name": name, "config": {k: v for k, v in cfg.items() if k != "est_gib"}, "ok": False}
    t0 = time.time()

    def mem():
        torch.cuda.synchronize()
        st = torch.cuda.memory_stats()
        return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                "peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved(),
                "stats": {k: st.get(k, 0) for k in ALLOC_STATS}}

    phases = {}
    try:
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats()
        policy, params, opt_cfg, batch_fn, loss_fn, meta = build(cfg)
        res["meta"] = meta
        policy.train()
        phases["load"] = mem()
        res["census"] = param_census(policy)
        if cfg.get("tensor_list", True):
            # The model code's own tensor list: [name, shape, dtype, requires_grad] (and buffers).
            res["tensors"] = [[n, list(p.shape), str(p.dtype).replace("torch.", ""), p.requires_grad]
                              for n, p in policy.named_parameters()]
            res["buffers"] = [[n, list(b.shape), str(b.dtype).replace("torch.", "")] for n, b in policy.named_buffers()]
        params = list(params)
        opt = opt_cfg.build(params)
        res["optimizer"] = {"class": type(opt).__name__, "defaults": {k: (list(v) if isinstance(v, tuple) else v)
                                                                      for k, v in opt.defaults.items()
                                                                      if isinstance(v, (int, float, bool, tuple, type(None)))},
                            "grad_clip_norm": opt_cfg.grad_clip_norm}
        trainable = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
        b = batch_fn()
        torch.cuda.synchronize()
        phases["batch"] = mem()
        record = not cfg.get("gradient_checkpointing")  # see NO_RECORD_WHY
        res["snapshot_recorded"] = record
        start_segments = torch.cuda.memory._snapshot()["segments"] if name in TRACE_CONFIGS else None
        if record:
            torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=MAX_ENTRIES)
        from torch.autograd.profiler import record_function
        census = SavedCensus(policy) if cfg.get("census", True) and not cfg.get("gradient_checkpointing") else None
        leak = cfg.get("leak") == "retain_graph"
        kept = []  # the leak: every step's loss, with its graph
        step_times = []
        last = STEPS - 1
        steps_peak = {"peak_allocated": 0, "peak_reserved": 0}
        for step in range(STEPS):
            ts = time.time()
            # Step 1 (no optimizer state yet) and the last step (steady: the state in place) are
            # measured phase by phase; steps 2..5 together give the steady peak.
            timed = step in (0, last)
            sfx = "" if step == 0 else "_steady"
            if step == last and step > 0:
                m = mem()
                steps_peak = {k: max(steps_peak[k], m[k]) for k in steps_peak}
            if timed:
                torch.cuda.reset_peak_memory_stats()
            with record_function(f"vlac:forward#{step}"):
                if census is not None and step == 0:
                    with census:
                        loss = loss_fn(policy, b)
                else:
                    loss = loss_fn(policy, b)
            if timed:
                phases["forward" + sfx] = mem()
                torch.cuda.reset_peak_memory_stats()
            with record_function(f"vlac:backward#{step}"):
                loss.backward(retain_graph=leak)
            if timed:
                phases["backward" + sfx] = mem()
                torch.cuda.reset_peak_memory_stats()
            with record_function(f"vlac:optimizer#{step}"):
                gn = torch.nn.utils.clip_grad_norm_(trainable, opt_cfg.grad_clip_norm)
                opt.step()
                opt.zero_grad()
            if leak:
                kept.append(loss)
            del loss
            if timed:
                phases["optimizer" + sfx] = mem()
                if step == 0:
                    torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
            step_times.append(time.time() - ts)
            if step > 0:
                b = batch_fn()  # a fresh batch each step, as a data loader gives
            if step == 0:
                phases["after_step1"] = mem()
        end = mem()
        if STEPS > 1:
            for k in ("forward_steady", "backward_steady", "optimizer_steady"):
                steps_peak = {q: max(steps_peak[q], phases[k][q]) for q in steps_peak}
            end.update(steps_peak)
        phases["steps"] = end
        res["grad_norm"] = float(gn)
        if census is not None:
            res["saved_census"] = census.result()
        if record:
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            res["segments_end"] = segment_summary(snap["segments"])
            if name in TRACE_CONFIGS:
                write_compact_trace(snap, start_segments, os.path.join(out_dir, f"trace_{name}.bin.xz"))
            postprocess_snapshot(snap, name, out_dir, res)
        else:
            res["segments_end"] = segment_summary(torch.cuda.memory._snapshot()["segments"])
        free, total = torch.cuda.mem_get_info()
        res["device"] = {"total": total, "free": free, "used_by_all": total - free,
                         "reserved": torch.cuda.memory_reserved(), "nvml_this_process": nvml_used()}
        res["step_seconds"] = step_times
        res["ok"] = True
    except Exception as e:  # an OOM is a result too
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
        res["traceback"] = traceback.format_exc()[-4000:]
        res["oom"] = "out of memory" in str(e).lower()
        try:
            phases["at_error"] = mem()
        except Exception:  # noqa: BLE001
            pass
    res["phases"] = phases
    res["peak_allocated"] = max((p["peak_allocated"] for k, p in phases.items() if k != "load"), default=0)
    res["peak_reserved"] = max((p["peak_reserved"] for k, p in phases.items() if k != "load"), default=0)
    if "steps" in phases:  # steps 2..5 (the steady peak), as in the first measuring calls
        res["peak_allocated_steps"] = phases["steps"]["peak_allocated"]
    res["wall_s"] = time.time() - t0
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res.get(k) for k in ("name", "ok", "peak_allocated", "peak_reserved", "error", "wall_s")}),
          flush=True)


def nvml_used():
    """NVML's memory for this process (torch's reserve + context + libraries), None if unseen."""
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                return int(p.usedGpuMemory)
        return None
    except Exception:  # noqa: BLE001
        return None


def versions():
    v = {"python": platform.python_version()}
    try:
        import torch
        v["torch"] = torch.__version__
        v["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            v["gpu"] = torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        v["torch"] = repr(e)
    for mod in ("transformers", "lerobot", "peft", "diffusers", "accelerate"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            v[mod] = f"unavailable: {e}"[:200]
    try:
        v["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # noqa: BLE001
        v["driver"] = repr(e)
    return v


def drive(names, out_dir, budget_gib, deadline_s, tar_name, max_tar_mib, run_timeout_s=150):
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    summary = {"argv": sys.argv, "runs": [], "not_run": []}
    pending = list(names)
    running = []  # (name, proc, est, cmd)
    while pending or running:
        for r in list(running):
            if r[1].poll() is not None:
                running.remove(r)
            elif time.time() - r[4] > run_timeout_s:
                r[1].kill()
                print(f"killed {r[0]} after {run_timeout_s} s", flush=True)
        used = sum(r[2] for r in running)
        while pending and time.time() - t0 < deadline_s:
            n = pending[0]
            est = CONFIGS[n]["est_gib"]
            if running and used + est > budget_gib:
                break
            cmd = [sys.executable, os.path.abspath(__file__), "--run", n, "--out", out_dir]
            log = open(os.path.join(out_dir, f"{n}.log"), "w")
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            summary["runs"].append({"name": n, "command": shlex.join(cmd), "alongside": [r[0] for r in running],
                                    "started_s": round(time.time() - t0, 1)})
            running.append((n, p, est, cmd, time.time()))
            print(f"[{time.time() - t0:6.1f}s] start {n} (est {est} GiB, running {used + est} GiB)", flush=True)
            used += est
            pending.pop(0)
        if pending and time.time() - t0 >= deadline_s and not running:
            break
        time.sleep(1)
    summary["not_run"] = pending
    summary["versions"] = versions()  # after the runs: this process's own CUDA context stays off the card meanwhile
    results = {}
    for r in summary["runs"]:
        path = os.path.join(out_dir, f"{r['name']}.json")
        if os.path.exists(path):
            with open(path) as f:
                results[r["name"]] = json.load(f)
        else:
            with open(os.path.join(out_dir, f"{r['name']}.log")) as f:
                results[r["name"]] = {"name": r["name"], "ok": False, "error": "no result", "log_tail": f.read()[-3000:]}
        results[r["name"]]["command"] = r["command"]
        results[r["name"]]["ran_alongside"] = r["alongside"]
    summary["results"] = results
    summary["wall_s"] = time.time() - t0
    # Fixture snapshots (measured_*.pickle.xz) into one uncompressed tar, smallest first, up to
    # the cap; every run's log into logs.tar.xz; the per-run JSONs live on in train_memory.json.
    xzs = sorted((os.path.getsize(os.path.join(out_dir, f)), f) for f in os.listdir(out_dir)
                 if f.endswith((".pickle.xz", ".bin.xz")))
    packed, total = [], 0
    with tarfile.open(os.path.join(out_dir, tar_name), "w") as tar:
        for size, f in xzs:
            if total + size > max_tar_mib * MIB:
                continue
            tar.add(os.path.join(out_dir, f), arcname=f)
            packed.append(f)
            total += size
    summary["snapshots_packed"] = packed
    with tarfile.open(os.path.join(out_dir, "logs.tar.xz"), "w:xz") as tar:
        for f in sorted(os.listdir(out_dir)):
            if f.endswith(".log"):
                tar.add(os.path.join(out_dir, f), arcname=f)
    for f in os.listdir(out_dir):
        if f.endswith((".log", ".pickle", ".pickle.xz", ".bin.xz")) or (f.endswith(".json") and f[:-5] in CONFIGS):
            os.remove(os.path.join(out_dir, f))
    with open(os.path.join(out_dir, "train_memory.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({n: (r.get("ok"), r.get("peak_allocated"), r.get("peak_reserved"), r.get("error", "")[:200],
                          ((r.get("vlac") or {}).get("json") or {}).get("shape"))
                      for n, r in results.items()}, indent=1))
    print("not run:", pending, "packed:", packed, "bytes:", total)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", help="run one configuration in this process")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--configs", default="", help="comma-separated configuration names (driver mode)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--budget-gib", type=float, default=120.0, help="sum of estimated peaks run at once")
    ap.add_argument("--deadline-s", type=float, default=240.0, help="start no run after this many seconds")
    ap.add_argument("--tar", default="snapshots.tar")
    ap.add_argument("--max-tar-mib", type=float, default=14.0)
    a = ap.parse_args()
    if a.list:
        for n, c in CONFIGS.items():
            print(n, c)
        return
    if a.run:
        os.makedirs(a.out, exist_ok=True)
        run_one(a.run, a.out)
        return
    names = [n for n in a.configs.split(",") if n]
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        sys.exit(f"unknown configurations: {bad}; --list shows them")
    drive(names, a.out, a.budget_gib, a.deadline_s, a.tar, a.max_tar_mib)


if __name__ == "__main__":
    main()
