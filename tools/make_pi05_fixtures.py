#!/usr/bin/env python3
# Writes tiny pi0.5 reference fixtures (policy folder, observation, noise, expected actions and
# intermediates) by running lerobot's own PI05Policy; it never reimplements the model itself.
"""Make pi0.5 reference fixtures from lerobot itself.

lerobot fixes the model widths by variant name ("gemma_2b", "gemma_300m") and SigLIP So400m sizes,
so this script monkeypatches lerobot's size tables *before construction* (get_gemma_config, the
PaliGemma vision/text config and the vocabulary) while config.json keeps the real variant names:
the C++ side must take every size from the tensor shapes.

Every parameter is re-drawn at random and non-zero (also the RMSNorm offsets and adaRMS denses
that lerobot initialises to zero), fp32. The policy folder is written by lerobot's
save_pretrained and the processors by lerobot's make_pi05_pre_post_processors with made-up
dataset statistics.

Also writes processor-pipeline cases (pipe_*): raw frames/state/task through lerobot's own saved
pre/post-processor pipelines, with a Gemma-style SentencePiece model trained by Debian's spm_train.

Usage (CPU is fine; see tests/fixtures/pi05/README.md for the exact versions and every output name):
    python tools/make_pi05_fixtures.py --out tests/fixtures/pi05 [--pipeline-only]
Runs with lerobot's pinned transformers (5.5.x) and with transformers >= 5.6 (5.17 checked).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import math
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import lerobot
import transformers
from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
from lerobot.policies.pi05 import modeling_pi05
from lerobot.policies.pi05.configuration_pi05 import PI05Config
from lerobot.policies.pi05.modeling_pi05 import PI05Policy
from lerobot.policies import pi_gemma

TOKENIZER_HUB_ID = "google/paligemma-3b-pt-224"


# --------------------------------------------------------------------------------------------
# Tiny model descriptions
# --------------------------------------------------------------------------------------------


@dataclass
class Gemma:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    head_dim: int
    num_kv_heads: int = 1


@dataclass
class Vision:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch: int


@dataclass
class TinyModel:
    name: str
    vlm: Gemma
    expert: Gemma
    vision: Vision
    vocab: int
    image_size: int
    cameras: list[str]
    state_dim: int
    action_dim: int
    max_state_dim: int
    max_action_dim: int
    chunk_size: int
    n_action_steps: int
    num_steps: int
    tokenizer_max_length: int
    seed: int
    dtype: str = "float32"
    extra: dict = field(default_factory=dict)


MODEL_A = TinyModel(
    name="tiny_a",
    vlm=Gemma(width=48, depth=2, mlp_dim=128, num_heads=2, head_dim=16),
    expert=Gemma(width=32, depth=2, mlp_dim=64, num_heads=2, head_dim=16),
    vision=Vision(width=32, depth=2, mlp_dim=64, num_heads=4, patch=14),
    vocab=1024,
    image_size=56,  # 4x4 = 16 image tokens per camera
    cameras=["observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb"],
    state_dim=6,
    action_dim=6,
    max_state_dim=8,
    max_action_dim=8,
    chunk_size=6,
    n_action_steps=4,
    num_steps=3,
    tokenizer_max_length=16,
    seed=1234,
)

MODEL_B = TinyModel(
    name="tiny_b",
    vlm=Gemma(width=96, depth=3, mlp_dim=160, num_heads=3, head_dim=16),
    expert=Gemma(width=40, depth=3, mlp_dim=72, num_heads=3, head_dim=16),
    vision=Vision(width=48, depth=3, mlp_dim=96, num_heads=6, patch=8),
    vocab=768,
    image_size=40,  # 5x5 = 25 image tokens per camera
    cameras=[
        "observation.images.cam_high",
        "observation.images.cam_left_wrist",
        "observation.images.cam_right_wrist",
    ],
    state_dim=9,
    action_dim=7,
    max_state_dim=16,
    max_action_dim=12,
    chunk_size=5,
    n_action_steps=5,
    num_steps=4,
    tokenizer_max_length=24,
    seed=4321,
)

# Same weights as tiny_a (same seed, same draw order) run by lerobot in its dtype="bfloat16" mode:
# lerobot casts the Gemma weights to bf16 and keeps SigLIP, projector, norms and adaRMS denses f32.
MODEL_A_BF16 = dataclasses.replace(MODEL_A, name="tiny_a_bf16", dtype="bfloat16")

# The model being built right now; read by the monkeypatched lerobot size tables below.
_ACTIVE: TinyModel | None = None


# --------------------------------------------------------------------------------------------
# Monkeypatches (applied at import time of this script; no installed file is edited)
# --------------------------------------------------------------------------------------------


def _tiny_get_gemma_config(variant: str):
    assert _ACTIVE is not None
    g = {"gemma_2b": _ACTIVE.vlm, "gemma_300m": _ACTIVE.expert}[variant]
    return modeling_pi05.GemmaConfig(
        width=g.width,
        depth=g.depth,
        mlp_dim=g.mlp_dim,
        num_heads=g.num_heads,
        num_kv_heads=g.num_kv_heads,
        head_dim=g.head_dim,
    )


_OrigPaliGemma = modeling_pi05.PaliGemmaForConditionalGenerationWithPiGemma
_OrigExpert = modeling_pi05.PiGemmaForCausalLM


class _TinyPaliGemma(_OrigPaliGemma):
    def __init__(self, config):
        m = _ACTIVE
        vc = config.vision_config
        vc.hidden_size = m.vision.width
        vc.num_hidden_layers = m.vision.depth
        vc.intermediate_size = m.vision.mlp_dim
        vc.num_attention_heads = m.vision.num_heads
        vc.patch_size = m.vision.patch
        vc.projection_dim = m.vlm.width  # lerobot hard-codes 2048 (the Gemma-2B width)
        config.text_config.vocab_size = m.vocab
        config._vocab_size = m.vocab  # noqa: SLF001
        config.image_token_index = m.vocab
        super().__init__(config)


class _TinyExpert(_OrigExpert):
    def __init__(self, config, **kwargs):
        config.vocab_size = _ACTIVE.vocab
        super().__init__(config, **kwargs)


modeling_pi05.get_gemma_config = _tiny_get_gemma_config
modeling_pi05.PaliGemmaForConditionalGenerationWithPiGemma = _TinyPaliGemma
modeling_pi05.PiGemmaForCausalLM = _TinyExpert

# transformers >= 5.6 dropped create_causal_mask's `cache_position`; lerobot 0.6.x still passes it.
# pi05 always passes a ready 4-D additive mask, which create_causal_mask returns unchanged.
_orig_create_causal_mask = pi_gemma.create_causal_mask
if "cache_position" not in inspect.signature(_orig_create_causal_mask).parameters:

    def _create_causal_mask_compat(*args, cache_position=None, **kwargs):  # noqa: ARG001
        return _orig_create_causal_mask(*args, **kwargs)

    pi_gemma.create_causal_mask = _create_causal_mask_compat
    CAUSAL_MASK_PATCHED = True
else:
    CAUSAL_MASK_PATCHED = False


# Tokenizer: PaliGemma's cannot be downloaded; the processor JSON still names the hub id, as a
# real lerobot save does. Core fixtures use pre-tokenized prompts, so no tokenizer is called.
class _NoDownloadTokenizer:
    @staticmethod
    def from_pretrained(name, *a, **k):  # noqa: ARG004
        return _LOCAL_TOKENIZER


_LOCAL_TOKENIZER = None
from lerobot.processor import tokenizer_processor  # noqa: E402

tokenizer_processor.AutoTokenizer = _NoDownloadTokenizer


# --------------------------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------------------------


def make_config(m: TinyModel) -> PI05Config:
    res = (m.image_size, m.image_size)
    input_features = {cam: PolicyFeature(type=FeatureType.VISUAL, shape=(3, *res)) for cam in m.cameras}
    input_features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(m.state_dim,))
    output_features = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(m.action_dim,))}
    return PI05Config(
        input_features=input_features,
        output_features=output_features,
        chunk_size=m.chunk_size,
        n_action_steps=m.n_action_steps,
        num_inference_steps=m.num_steps,
        max_state_dim=m.max_state_dim,
        max_action_dim=m.max_action_dim,
        image_resolution=res,
        tokenizer_max_length=m.tokenizer_max_length,
        dtype=m.dtype,
        device="cpu",
        push_to_hub=False,
    )


def build_policy(m: TinyModel, config: PI05Config | None = None) -> PI05Policy:
    global _ACTIVE
    _ACTIVE = m
    cfg = config if config is not None else make_config(m)
    policy = PI05Policy(cfg)
    policy.eval()
    return policy


def randomize_(policy: PI05Policy, seed: int) -> None:
    """Every parameter random and non-zero; scales keep activations O(1) through the tiny nets."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            shape = p.shape
            if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
                std = 1.0 / math.sqrt(shape[1])
                v = torch.randn(shape, generator=g) * std
            elif "position_embedding" in name:
                v = torch.randn(shape, generator=g) * 0.5
            elif "patch_embedding.weight" in name:
                fan_in = shape[1] * shape[2] * shape[3]
                v = torch.randn(shape, generator=g) / math.sqrt(fan_in)
            elif name.endswith("layernorm.weight") or name.endswith("norm.weight") or "layer_norm" in name:
                if "vision" in name and name.endswith(".weight"):  # LayerNorm scale (not an offset)
                    v = 1.0 + 0.3 * (torch.rand(shape, generator=g) * 2 - 1)
                else:  # LayerNorm bias or Gemma RMSNorm offset (scale = 1 + w)
                    v = 0.3 * (torch.rand(shape, generator=g) * 2 - 1)
            elif ".dense.weight" in name:  # adaRMS: scale|shift|gate from the time condition
                v = torch.randn(shape, generator=g) * (0.5 / math.sqrt(shape[1]))
            elif ".dense.bias" in name:
                v = 0.2 * (torch.rand(shape, generator=g) * 2 - 1)
                # gate bias around 1 so the gated residual branches stay alive
                d = shape[0] // 3
                v[2 * d :] += 1.0
            elif p.ndim == 2:
                v = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            elif p.ndim == 1:
                v = 0.1 * (torch.rand(shape, generator=g) * 2 - 1)
            else:
                raise RuntimeError(f"unhandled parameter {name} {tuple(shape)}")
            # non-zero everywhere, also after a bf16 round trip
            tiny = v.abs() < 1e-3
            v[tiny] = torch.where(v[tiny] < 0, -1e-3, 1e-3)
            p.copy_(v.to(p.dtype))
            assert (p != 0).all(), name


# --------------------------------------------------------------------------------------------
# Observation, noise, statistics
# --------------------------------------------------------------------------------------------


def make_stats(m: TinyModel, g: torch.Generator) -> dict:
    def feat(dim):
        lo = torch.randn(dim, generator=g) - 1.5
        hi = lo + 0.5 + 2.0 * torch.rand(dim, generator=g)
        mean = (lo + hi) / 2 + 0.1 * torch.randn(dim, generator=g)
        std = (hi - lo) / 4
        return {
            "min": lo - 0.2,
            "max": hi + 0.2,
            "mean": mean,
            "std": std,
            "q01": lo,
            "q10": lo + 0.1 * (hi - lo),
            "q50": (lo + hi) / 2,
            "q90": hi - 0.1 * (hi - lo),
            "q99": hi,
            "count": torch.tensor([1000.0]),
        }

    stats = {"observation.state": feat(m.state_dim), "action": feat(m.action_dim)}
    for cam in m.cameras:
        stats[cam] = {
            "mean": torch.full((3, 1, 1), 0.5),
            "std": torch.full((3, 1, 1), 0.25),
            "min": torch.zeros(3, 1, 1),
            "max": torch.ones(3, 1, 1),
        }
    return stats


def make_tokens(m: TinyModel, n_real: int, g: torch.Generator):
    L = m.tokenizer_max_length
    ids = torch.zeros(L, dtype=torch.int64)
    ids[0] = 2  # BOS
    ids[1:n_real] = torch.randint(3, m.vocab, (n_real - 1,), generator=g)
    mask = torch.zeros(L, dtype=torch.bool)
    mask[:n_real] = True
    return ids, mask


# --------------------------------------------------------------------------------------------
# Run lerobot with recording hooks
# --------------------------------------------------------------------------------------------


def run_lerobot(policy: PI05Policy, batch: dict, noise: torch.Tensor, record: bool = True):
    """Runs lerobot's own predict_action_chunk with the given noise; returns (actions, record)."""
    model = policy.model
    pwe = model.paligemma_with_expert
    rec: dict[str, torch.Tensor] = {}
    handles = []
    phase = {"name": "vision", "step": -1}
    cam_order: list[str] = []

    present = [k for k in policy.config.image_features if k in batch]
    absent = [k for k in policy.config.image_features if k not in batch]
    cam_order = present + absent
    vis_calls = {"n": 0}

    def put(k, t):
        rec[k] = t.detach().to(torch.float32).clone().contiguous() if t.is_floating_point() else t.detach().clone().contiguous()

    if record:
        vt = pwe.paligemma.model.vision_tower
        proj = pwe.paligemma.model.multi_modal_projector

        def vision_hook(mod, inp, out):
            put(f"vision_out.{cam_order[vis_calls['n']]}", out.last_hidden_state[0])

        def proj_hook(mod, inp, out):
            put(f"image_tokens.{cam_order[vis_calls['n']]}", out[0])
            vis_calls["n"] += 1

        handles.append(vt.register_forward_hook(vision_hook))
        handles.append(proj.register_forward_hook(proj_hook))

        for li, layer in enumerate(pwe.paligemma.model.language_model.layers):

            def lm_hook(mod, inp, out, li=li):
                if phase["name"] == "prefix":
                    put(f"prefix_hidden.{li}", out[0])

            handles.append(layer.register_forward_hook(lm_hook))
        for li, layer in enumerate(pwe.gemma_expert.model.layers):

            def ex_hook(mod, inp, out, li=li):
                if phase["name"] == "denoise":
                    put(f"step.{phase['step']}.expert_hidden.{li}", out[0])

            handles.append(layer.register_forward_hook(ex_hook))

    orig_embed_prefix = model.embed_prefix
    orig_pwe_forward = pwe.forward
    orig_denoise = model.denoise_step
    orig_sample_actions = model.sample_actions
    orig_sample_noise = model.sample_noise
    orig_embed_suffix = model.embed_suffix

    def embed_prefix(*a, **k):
        embs, pad, att = orig_embed_prefix(*a, **k)
        if record:
            put("prefix.embeddings", embs[0])
            put("prefix.pad_mask", pad[0])
            put("prefix.position_ids", (torch.cumsum(pad, dim=1) - 1)[0])
        return embs, pad, att

    def pwe_forward(*a, **k):
        embeds = k.get("inputs_embeds")
        if embeds is not None and embeds[1] is None:
            phase["name"] = "prefix"
            out = orig_pwe_forward(*a, **k)
            if record:
                for li, (kk, vv, _sw) in enumerate(out[1]):
                    assert kk.shape[0] == 1 and kk.shape[1] == 1, kk.shape
                    put(f"prefix.k.{li}", kk[0, 0])
                    put(f"prefix.v.{li}", vv[0, 0])
            phase["name"] = "idle"
            return out
        return orig_pwe_forward(*a, **k)

    def embed_suffix(x_t, timestep):
        out = orig_embed_suffix(x_t, timestep)
        if record:
            s = phase["step"]
            put(f"step.{s}.time", timestep[:1])
            put(f"step.{s}.action_tokens", out[0][0])
            put(f"step.{s}.cond", out[3][0])
        return out

    def denoise_step(prefix_pad_masks, past_key_values, x_t, timestep):
        phase["step"] += 1
        phase["name"] = "denoise"
        if record:
            put(f"step.{phase['step']}.x_in", x_t[0])
        v = orig_denoise(
            prefix_pad_masks=prefix_pad_masks, past_key_values=past_key_values, x_t=x_t, timestep=timestep
        )
        if record:
            put(f"step.{phase['step']}.velocity", v[0])
            # x after this Euler step, exactly as euler_integrate computes it
            dt = -1.0 / policy.config.num_inference_steps
            put(f"step.{phase['step']}.x", (x_t + dt * v)[0])
        phase["name"] = "idle"
        return v

    def sample_actions(*a, **k):
        out = orig_sample_actions(*a, **k)
        rec["action_normalized"] = out[0].detach().clone().contiguous()
        return out

    model.embed_prefix = embed_prefix
    pwe.forward = pwe_forward
    model.denoise_step = denoise_step
    model.embed_suffix = embed_suffix
    model.sample_actions = sample_actions
    model.sample_noise = lambda shape, device: noise.reshape(shape).to(device).clone()
    try:
        with torch.no_grad():
            actions = policy.predict_action_chunk(batch)
    finally:
        for h in handles:
            h.remove()
        model.embed_prefix = orig_embed_prefix
        pwe.forward = orig_pwe_forward
        model.denoise_step = orig_denoise
        model.embed_suffix = orig_embed_suffix
        model.sample_actions = orig_sample_actions
        model.sample_noise = orig_sample_noise
    if not record:
        rec = {"action_normalized": rec["action_normalized"]}
    return actions, rec


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


def write_policy(m: TinyModel, policy: PI05Policy, stats: dict, out: Path) -> None:
    from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors

    if out.exists():
        shutil.rmtree(out)
    policy.save_pretrained(out)
    pre, post = make_pi05_pre_post_processors(policy.config, dataset_stats=stats)
    pre.save_pretrained(out)
    post.save_pretrained(out)


def add_vision_heads_key(policy_dir: Path, heads: int) -> None:
    cfg_path = policy_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["vision_num_attention_heads"] = heads
    cfg_path.write_text(json.dumps(cfg, indent=4) + "\n")


def make_obs(m: TinyModel, g: torch.Generator, n_real_tokens: int, batch_dim: bool) -> dict:
    obs = {}
    for cam in m.cameras:
        img = torch.rand((1, 3, m.image_size, m.image_size), generator=g)
        obs[cam] = img
    obs["observation.state"] = torch.rand((1, m.state_dim), generator=g) * 2 - 1
    ids, mask = make_tokens(m, n_real_tokens, g)
    obs["observation.language.tokens"] = ids[None]
    obs["observation.language.attention_mask"] = mask[None]
    if not batch_dim:
        obs = {k: v[0] for k, v in obs.items()}
    return obs


def to_batch(obs: dict) -> dict:
    out = {}
    for k, v in obs.items():
        if k == "observation.language.tokens" or k == "observation.language.attention_mask":
            out[k] = v if v.ndim == 2 else v[None]
        elif k.startswith("observation.images."):
            out[k] = v if v.ndim == 4 else v[None]
        else:
            out[k] = v if v.ndim == 2 else v[None]
    return out


def unnormalize(post, actions_cropped: torch.Tensor) -> torch.Tensor:
    return post(actions_cropped)


def write_case(
    case_dir: Path,
    policy_dir_name: str,
    policy: PI05Policy,
    post,
    obs: dict,
    noise: torch.Tensor,
    meta: dict,
) -> dict:
    case_dir.mkdir(parents=True, exist_ok=True)
    batch = to_batch(obs)
    actions, rec = run_lerobot(policy, batch, noise[None])
    rec["action"] = post(actions)[0].to(torch.float32).contiguous()
    assert torch.equal(rec["action_normalized"][:, : actions.shape[-1]], actions[0])
    save_file({k: v.contiguous() for k, v in obs.items()}, str(case_dir / "obs.safetensors"))
    save_file({"noise": noise.contiguous()}, str(case_dir / "noise.safetensors"))
    save_file(rec, str(case_dir / "expected.safetensors"), metadata={k: str(v) for k, v in meta.items()})
    if policy_dir_name != "policy":
        link = case_dir / "policy"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(policy_dir_name)
    return rec


# --------------------------------------------------------------------------------------------
# Processor-pipeline cases (issue 5): raw frames, raw state and task text through lerobot's own
# saved pre/post-processor pipelines, with a SentencePiece tokenizer made by spm_train.
# --------------------------------------------------------------------------------------------

SPM_TRAIN_ARGS = [
    "--vocab_size=600",
    "--model_type=bpe",
    "--pad_id=0",
    "--eos_id=1",
    "--bos_id=2",
    "--unk_id=3",
    "--pad_piece=<pad>",
    "--eos_piece=<eos>",
    "--bos_piece=<bos>",
    "--unk_piece=<unk>",
    "--byte_fallback=true",
    "--split_digits=true",
    "--add_dummy_prefix=false",
    "--remove_extra_whitespaces=false",
    "--normalization_rule_name=identity",
    "--allow_whitespace_only_pieces=true",
    "--character_coverage=1.0",
]


def spm_corpus() -> str:
    import random

    rnd = random.Random(0)
    verbs = ["pick up", "put down", "place", "move", "push", "open", "close", "grasp", "rotate", "lift",
             "stack", "insert", "fold", "wipe", "pour"]
    objs = ["the red cube", "a blue bowl", "the green block", "the towel", "the drawer", "a cup",
            "the yellow sponge", "the left box", "the bottle cap", "two spoons", "the plate", "a wooden peg"]
    dest = ["on the plate", "into the bin", "to the left", "near the robot", "in the drawer",
            "on top of the box", "behind the cup", ""]
    lines = []
    for _ in range(3000):
        s = f"Task: {rnd.choice(verbs)} {rnd.choice(objs)} {rnd.choice(dest)}".strip()
        st = " ".join(str(rnd.randint(0, 255)) for _ in range(rnd.randint(3, 12)))
        lines.append(s + ", State: " + st + ";")
        lines.append("Action: ")
    return "\n".join(lines) + "\n"


def ensure_tokenizer(tok_dir: Path):
    """Gemma-style BPE SentencePiece model (ids: pad 0, eos 1, bos 2, unk 3; byte fallback, split
    digits, identity normalization, no dummy prefix) + the HF tokenizer transformers converts from it."""
    import subprocess
    import tempfile

    from transformers import AutoTokenizer

    tok_dir.mkdir(parents=True, exist_ok=True)
    model = tok_dir / "tokenizer.model"
    if not model.exists():
        with tempfile.TemporaryDirectory() as td:
            corpus = Path(td) / "corpus.txt"
            corpus.write_text(spm_corpus())
            subprocess.run(
                ["spm_train", "--input=corpus.txt", "--model_prefix=tokenizer", *SPM_TRAIN_ARGS],
                cwd=td,  # relative paths: the trainer spec stored in the model stays reproducible
                check=True,
                capture_output=True,
            )
            shutil.copy(Path(td) / "tokenizer.model", model)
    cfg = {
        "tokenizer_class": "GemmaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "pad_token": "<pad>",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "unk_token": "<unk>",
    }
    with tempfile.TemporaryDirectory() as td:
        shutil.copy(model, Path(td) / "tokenizer.model")
        (Path(td) / "tokenizer_config.json").write_text(json.dumps(cfg))
        tok = AutoTokenizer.from_pretrained(td)
    return tok


@dataclass
class PipeCase:
    name: str
    base: TinyModel
    norm: str  # QUANTILES or MEAN_STD (state and action)
    relative: bool
    action_names: list[str] | None
    tokenizer_max_length: int
    task: str
    frames: dict  # cam -> ("uint8_hwc" | "float_chw", H, W) ; a cam missing here is absent
    state_scale: float = 1.0  # how far the raw state reaches beyond [q01, q99]
    zero_range_dim: int | None = None  # make q01 == q99 (and min == max) for this state/action dim


PIPE_CASES = [
    PipeCase(
        name="pipe_b_quantiles",
        base=MODEL_B,
        norm="QUANTILES",
        relative=False,
        action_names=None,
        tokenizer_max_length=64,
        task="  pick_up the red cube\nthen stop ",
        frames={
            "observation.images.cam_high": ("uint8_hwc", 30, 50),
            "observation.images.cam_left_wrist": ("float_chw", 64, 48),
            "observation.images.cam_right_wrist": ("uint8_hwc", 40, 40),
        },
        state_scale=1.3,
    ),
    PipeCase(
        name="pipe_b_meanstd_relative",
        base=MODEL_B,
        norm="MEAN_STD",
        relative=True,
        action_names=["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "Right_Gripper", "gripper"],
        tokenizer_max_length=64,
        task="fold the towel",
        frames={
            "observation.images.cam_high": ("float_chw", 45, 37),
            "observation.images.cam_right_wrist": ("uint8_hwc", 24, 80),
        },
    ),
    PipeCase(
        name="pipe_a_truncated_relative",
        base=MODEL_A,
        norm="QUANTILES",
        relative=True,
        action_names=None,
        tokenizer_max_length=16,  # the prompt is longer: lerobot truncates
        task="Stack two spoons on the plate",
        frames={
            "observation.images.base_0_rgb": ("float_chw", 70, 90),
            "observation.images.left_wrist_0_rgb": ("uint8_hwc", 112, 112),
        },
        zero_range_dim=2,
    ),
]


def run_pipe_case(c: PipeCase, out: Path, tok) -> dict:
    global _LOCAL_TOKENIZER
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors
    from lerobot.policies.utils import prepare_observation_for_inference

    _LOCAL_TOKENIZER = tok
    m = c.base
    cfg = make_config(m)
    cfg.normalization_mapping = {
        "VISUAL": NormalizationMode.IDENTITY,
        "STATE": NormalizationMode(c.norm),
        "ACTION": NormalizationMode(c.norm),
    }
    cfg.use_relative_actions = c.relative
    cfg.action_feature_names = c.action_names
    cfg.tokenizer_max_length = c.tokenizer_max_length
    policy = build_policy(m, cfg)
    randomize_(policy, m.seed)  # same weights as the core case of the same model

    g = torch.Generator().manual_seed(m.seed + 100 + len(c.name))
    stats = make_stats(m, torch.Generator().manual_seed(m.seed))
    if c.zero_range_dim is not None:
        d = c.zero_range_dim
        for key in ("observation.state", "action"):
            st = stats[key]
            st["q99"][d] = st["q01"][d]
            st["max"][d] = st["min"][d]

    case_dir = out / c.name
    policy_dir = case_dir / "policy"
    if case_dir.exists():
        shutil.rmtree(case_dir)
    policy.save_pretrained(policy_dir)
    pre, post = make_pi05_pre_post_processors(policy.config, dataset_stats=stats)
    pre.save_pretrained(policy_dir)
    post.save_pretrained(policy_dir)
    tok_out = policy_dir / "tokenizer"
    tok.save_pretrained(tok_out)
    shutil.copy(out / "tokenizer" / "tokenizer.model", tok_out / "tokenizer.model")
    # The weights are the core case's: share the file instead of storing it twice.
    core_model = out / m.name / "policy" / "model.safetensors"
    if core_model.exists() and core_model.read_bytes() == (policy_dir / "model.safetensors").read_bytes():
        (policy_dir / "model.safetensors").unlink()
        (policy_dir / "model.safetensors").symlink_to(f"../../{m.name}/policy/model.safetensors")

    # Load everything back the way lerobot's inference does (factory reconnects relative/absolute).
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(policy_dir))

    # Raw observation as a robot delivers it.
    q01, q99 = stats["observation.state"]["q01"], stats["observation.state"]["q99"]
    u = torch.rand(m.state_dim, generator=g) * 2 - 1
    u[0], u[-1] = -c.state_scale, c.state_scale
    if c.norm == "MEAN_STD":
        st = stats["observation.state"]
        state = st["mean"] + u * st["std"]
    else:
        state = (q01 + q99) / 2 + u * (q99 - q01) / 2
    if c.zero_range_dim is not None:
        state[c.zero_range_dim] = q01[c.zero_range_dim] + 0.25
    raw_obs = {"observation.state": state.to(torch.float32)}
    np_obs = {"observation.state": state.numpy().astype(np.float32)}
    for cam, (kind, h, w) in c.frames.items():
        if kind == "uint8_hwc":
            fr = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8)
            raw_obs[cam] = fr
            np_obs[cam] = fr.numpy()
        else:
            fr = torch.rand((3, h, w), generator=g)
            raw_obs[cam] = fr
            np_obs[cam] = fr.permute(1, 2, 0).contiguous().numpy()  # lerobot's helper takes HWC
    batch = prepare_observation_for_inference(dict(np_obs), torch.device("cpu"), task=c.task)
    batch = pre(batch)

    noise = torch.randn((m.chunk_size, m.max_action_dim), generator=g)
    rec_images = {}
    orig_pp = policy._preprocess_images

    def pp(b):
        imgs, masks = orig_pp(b)
        present = [k for k in policy.config.image_features if k in b]
        for k, im in zip(present, imgs):
            rec_images[f"images.{k}"] = im[0].detach().clone().contiguous()
        return imgs, masks

    policy._preprocess_images = pp
    try:
        actions, rec = run_lerobot(policy, batch, noise[None], record=False)
    finally:
        policy._preprocess_images = orig_pp
    action = post(actions)

    prompt = batch.get("task")
    if isinstance(prompt, list):
        prompt = prompt[0]
    expected = {
        "observation.language.tokens": batch["observation.language.tokens"][0].contiguous(),
        "observation.language.attention_mask": batch["observation.language.attention_mask"][0].contiguous(),
        "observation.state.normalized": batch["observation.state"][0].to(torch.float32).contiguous(),
        "action_normalized": rec["action_normalized"],
        "action": action[0].to(torch.float32).contiguous(),
        **rec_images,
    }
    meta = {
        "case": c.name,
        "task": c.task,
        "prompt": prompt,
        "lerobot": lerobot.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "normalization": c.norm,
        "use_relative_actions": str(c.relative),
    }
    save_file({k: v.contiguous() for k, v in raw_obs.items()}, str(case_dir / "obs.safetensors"), metadata={"task": c.task})
    save_file({"noise": noise.contiguous()}, str(case_dir / "noise.safetensors"))
    save_file(expected, str(case_dir / "expected.safetensors"), metadata=meta)
    add_vision_heads_key(policy_dir, m.vision.num_heads)
    print(f"{c.name}: prompt={prompt!r}")
    print("  tokens", expected["observation.language.tokens"].tolist())
    print("  action", expected["action"][0].tolist())
    return expected


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/pi05"))
    ap.add_argument("--pipeline-only", action="store_true", help="only (re)make the pipe_* cases")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    summary = {}

    model_sets = () if args.pipeline_only else (
        (MODEL_A, [("tiny_a", None, MODEL_A.tokenizer_max_length, True)]),
        (MODEL_A_BF16, [("tiny_a_bf16", None, MODEL_A.tokenizer_max_length, True)]),
        (
            MODEL_B,
            [
                ("tiny_b", None, 13, False),
                ("tiny_b_absent_cam", "observation.images.cam_left_wrist", 13, False),
            ],
        ),
    )
    for m, cases in model_sets:
        g = torch.Generator().manual_seed(m.seed)
        policy = build_policy(m)
        randomize_(policy, m.seed)
        stats = make_stats(m, g)
        policy_dir = out / m.name / "policy"
        write_policy(m, policy, stats, policy_dir)

        # lerobot must load what it saved and give bit-identical actions (before the extra key)
        reloaded = PI05Policy.from_pretrained(str(policy_dir), strict=True)
        reloaded.eval()
        from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors  # noqa: F401
        from lerobot.processor import PolicyProcessorPipeline
        from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

        post = PolicyProcessorPipeline.from_pretrained(
            str(policy_dir),
            config_filename="policy_postprocessor.json",
            to_transition=policy_action_to_transition,
            to_output=transition_to_policy_action,
        )
        add_vision_heads_key(policy_dir, m.vision.num_heads)

        for case_name, drop_cam, n_real, batch_dim in cases:
            cg = torch.Generator().manual_seed(m.seed + 7)  # same obs for both model-B cases
            obs = make_obs(m, cg, n_real, batch_dim)
            noise = torch.randn((m.chunk_size, m.max_action_dim), generator=cg)
            if drop_cam is not None:
                del obs[drop_cam]
            meta = {
                "case": case_name,
                "lerobot": lerobot.__version__,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "dropped_camera": drop_cam or "",
                "n_real_tokens": n_real,
                "lerobot_dtype": m.dtype,
            }
            rec = write_case(out / case_name, "policy" if case_name == m.name else f"../{m.name}/policy", policy, post, obs, noise, meta)
            _, rec2 = run_lerobot(reloaded, to_batch(obs), noise[None], record=False)
            same = torch.equal(rec["action_normalized"], rec2["action_normalized"])
            print(f"{case_name}: reload identical={same}")
            assert same
            summary[case_name] = {k: list(v.shape) for k, v in rec.items() if not k.startswith("step.") or k.startswith("step.0.")}
            print(case_name, "action_normalized", rec["action_normalized"])

    tok = ensure_tokenizer(out / "tokenizer")
    for c in PIPE_CASES:
        run_pipe_case(c, out, tok)
    print(json.dumps({k: len(v) for k, v in summary.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
