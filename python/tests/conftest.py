"""Shared pieces of the Python tests: the float64 plain-torch MoE reference, GPU availability."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import pytest
import torch

import moekit


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and a moekit build with CUDA")


def gpu_skip_reason() -> Optional[str]:
    """Why the GPU tests cannot run here, or None."""
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU"
    if not moekit.built_with_cuda():
        return f"{moekit.library_path} was built without CUDA"
    if moekit.cuda_device_count() == 0:
        return "moekit sees no CUDA device"
    return None


def torch_version() -> Tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def activation_ref(name: str, h: torch.Tensor) -> torch.Tensor:
    """The library's activations (config/activation.h) in float64: gated ones map 2d -> d."""
    if name.endswith("_no_mul"):
        g, u = h, None
        name = name[: -len("_no_mul")]
    elif name == "swigluoai":
        g, u = h[:, 0::2], h[:, 1::2]
        g = g.clamp(max=7.0)
        u = u.clamp(-7.0, 7.0)
        return (u + 1.0) * g * torch.sigmoid(1.702 * g)
    else:
        d = h.shape[1] // 2
        g, u = h[:, :d], h[:, d:]
    if name == "silu":
        a = torch.nn.functional.silu(g)
    elif name == "gelu":
        a = 0.5 * g * (1.0 + torch.erf(g / math.sqrt(2.0)))
    elif name == "gelu_tanh":
        a = torch.nn.functional.gelu(g, approximate="tanh")
    elif name == "relu2":
        a = torch.relu(g) ** 2
    else:
        raise ValueError(name)
    return a if u is None else a * u


def reference_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    expert_map: Optional[torch.Tensor] = None,
    on_input: bool = False,
) -> torch.Tensor:
    """sum_k topk_weights[m, k] * w2[e] act(w13[e] x[m] + b13[e]) + b2[e], e = topk_ids[m, k]
    (through expert_map when given; unmapped experts add nothing), in float64."""
    x64 = x.double()
    M, H = x.shape
    out = torch.zeros(M, H, dtype=torch.float64, device=x.device)
    ids = topk_ids.long()
    if expert_map is not None:
        ids = expert_map.long()[ids]
    for e in ids.unique().tolist():
        if e < 0:
            continue
        rows, slots = (ids == e).nonzero(as_tuple=True)
        w = topk_weights[rows, slots].double().unsqueeze(1)
        xin = x64[rows] * w if on_input else x64[rows]
        h = xin @ w13[e].double().T
        if w13_bias is not None:
            h = h + w13_bias[e].double()
        y = activation_ref(activation, h) @ w2[e].double().T
        if w2_bias is not None:
            y = y + w2_bias[e].double()
        out.index_add_(0, rows, y if on_input else y * w)
    return out


def softmax_topk(logits: torch.Tensor, k: int, renormalize: bool = True):
    """Softmax top-k routing in float64: (weights float32, ids int64)."""
    probs = torch.softmax(logits.double(), dim=-1)
    w, ids = torch.topk(probs, k, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w.float(), ids


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double().cpu(), ref.double().cpu()
    denom = r.norm().item()
    return (o - r).norm().item() / (denom if denom > 0 else 1.0)


def layer_reference(layer: moekit.MoELayer, x: torch.Tensor, topk_weights, topk_ids):
    """A layer's output from its own experts read back (expert_reference), in float64."""
    experts = [layer.expert_reference(e) for e in range(layer.num_local_experts)]
    w13 = torch.stack([e["w13"] for e in experts]).to(x.device)
    w2 = torch.stack([e["w2"] for e in experts]).to(x.device)
    b13 = torch.stack([e["w13_bias"] for e in experts]).to(x.device) if experts[0]["w13_bias"] is not None else None
    b2 = torch.stack([e["w2_bias"] for e in experts]).to(x.device) if experts[0]["w2_bias"] is not None else None
    return reference_experts(x, w13, w2, topk_weights, topk_ids, "silu", b13, b2)


@pytest.fixture
def gpu() -> torch.device:
    reason = gpu_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return torch.device("cuda", torch.cuda.current_device())
