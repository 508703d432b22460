"""moekit.fused_experts (vLLM's functional MoE call) and the torch custom ops
torch.ops.moekit.fused_experts / torch.ops.moekit.layer_forward, which torch.compile traces as
single nodes (a fake implementation gives their output shapes)."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

import torch

from . import _lib
from ._lib import lib
from ._tensors import dltensor_pointer, pointer_or_none, stream_of
from .layer import _compiling, layer_by_id

_QUANTIZATION_ARGS = (
    "use_fp8_w8a8",
    "use_int8_w8a8",
    "use_int8_w8a16",
    "use_int4_w4a16",
    "use_mxfp4_w4a4",
    "per_channel_quant",
    "w1_scale",
    "w2_scale",
    "w1_zp",
    "w2_zp",
    "a1_scale",
    "a2_scale",
    "block_shape",
    "quant_config",
)


def fused_experts(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    inplace: bool = False,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[torch.Tensor] = None,
    w1_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    *,
    weights_prepared: bool = False,
    backend: str = "auto",
    out: Optional[torch.Tensor] = None,
    **quantization: Any,
) -> torch.Tensor:
    """vLLM's fused_experts, unquantized: sum over k of topk_weights[m, k] * expert(x[m]).

    hidden_states (M, H); w1 (E, N1, H) with N1 = 2I, rows [gate; up] for gated activations;
    w2 (E, H, I); topk_weights (M, k) float32; topk_ids (M, k) int32/int64. Runs on torch's
    current stream; `out` (M, H) is written when given. weights_prepared: w1 (and w1_bias) were
    rewritten by prepare_fused_experts_weights into the kernel's layout (needed for CUDA graphs
    on the GPU, where the Hopper kernels read a blocked gate/up layout)."""
    used = [k for k in _QUANTIZATION_ARGS if quantization.get(k) not in (None, False)]
    unknown = [k for k in quantization if k not in _QUANTIZATION_ARGS]
    if unknown:
        raise TypeError(f"fused_experts() got unexpected keyword arguments {unknown}")
    if used:
        raise NotImplementedError(
            f"moekit.fused_experts runs unquantized experts; got {used}: load quantized layers "
            "with moekit.MoELayer.from_checkpoint"
        )
    if _compiling():
        result = torch.ops.moekit.fused_experts(
            hidden_states, w1, w2, topk_weights, topk_ids, activation,
            apply_router_weight_on_input, global_num_experts, expert_map, w1_bias, w2_bias,
            weights_prepared, backend,
        )  # fmt: skip
    else:
        result = out if out is not None and not inplace else torch.empty_like(hidden_states)
        _call(
            result, hidden_states, w1, w2, topk_weights, topk_ids, activation,
            apply_router_weight_on_input, global_num_experts, expert_map, w1_bias, w2_bias,
            weights_prepared, backend,
        )  # fmt: skip
    if inplace:
        hidden_states.copy_(result)
        return hidden_states
    return result


def prepare_fused_experts_weights(
    w1: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    activation: str = "silu",
    w1_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    global_num_experts: int = -1,
    expert_map: Optional[torch.Tensor] = None,
    backend: str = "auto",
) -> str:
    """Rewrites w1 (and w1_bias) in place into the layout the chosen backend reads (vLLM's
    process_weights_after_loading); call fused_experts with weights_prepared=True afterwards.
    Returns the layout's name ("standard" when nothing changed)."""
    H = w1.shape[2]
    x = torch.empty(0, H, dtype=w1.dtype, device=w1.device)
    topk_weights = torch.empty(0, top_k, dtype=torch.float32, device=w1.device)
    topk_ids = torch.empty(0, top_k, dtype=torch.int32, device=w1.device)
    args = _args(
        None, x, w1, w2, topk_weights, topk_ids, activation, False, global_num_experts,
        expert_map, w1_bias, w2_bias, False, backend,
    )  # fmt: skip
    layout = ctypes.c_void_p()
    lib.moekit_fused_experts_prepare_weights(
        ctypes.byref(args), stream_of(w1.device), ctypes.byref(layout)
    )
    return _lib.take_string(layout)


def _args(
    out: Optional[torch.Tensor],
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    global_num_experts: int,
    expert_map: Optional[torch.Tensor],
    w13_bias: Optional[torch.Tensor],
    w2_bias: Optional[torch.Tensor],
    weights_prepared: bool,
    backend: str,
) -> _lib.FusedExpertsArgs:
    """The C struct (its DLTensor descriptors are valid while the tensors' memory is)."""
    a = _lib.FusedExpertsArgs(
        _ARGS_SIZE, dltensor_pointer(hidden_states), dltensor_pointer(w13), dltensor_pointer(w2),
        dltensor_pointer(topk_weights), dltensor_pointer(topk_ids), pointer_or_none(out),
        activation.encode(), 1 if apply_router_weight_on_input else 0, global_num_experts,
        pointer_or_none(expert_map), pointer_or_none(w13_bias), pointer_or_none(w2_bias),
        1 if weights_prepared else 0, backend.encode(),
    )  # fmt: skip
    return a


_ARGS_SIZE = ctypes.sizeof(_lib.FusedExpertsArgs)
_fused = lib.moekit_fused_experts


def _call(out: torch.Tensor, *args: Any) -> None:
    a = _args(out, *args)
    device = out.device
    _fused(ctypes.byref(a), stream_of(device) if device.type == "cuda" else None)


# ---- torch custom ops ------------------------------------------------------------------------------
FUSED_EXPERTS_SCHEMA = (
    "(Tensor hidden_states, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids, "
    "str activation, bool apply_router_weight_on_input, int global_num_experts, "
    "Tensor? expert_map, Tensor? w13_bias, Tensor? w2_bias, bool weights_prepared, str backend) "
    "-> Tensor"
)
LAYER_FORWARD_SCHEMA = "(Tensor hidden_states, Tensor router_logits, int layer_id) -> Tensor"


def _fused_experts_impl(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    global_num_experts: int,
    expert_map: Optional[torch.Tensor],
    w13_bias: Optional[torch.Tensor],
    w2_bias: Optional[torch.Tensor],
    weights_prepared: bool,
    backend: str,
) -> torch.Tensor:
    out = torch.empty_like(hidden_states)
    _call(
        out, hidden_states, w13, w2, topk_weights, topk_ids, activation,
        apply_router_weight_on_input, global_num_experts, expert_map, w13_bias, w2_bias,
        weights_prepared, backend,
    )  # fmt: skip
    return out


def _fused_experts_fake(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    global_num_experts: int,
    expert_map: Optional[torch.Tensor],
    w13_bias: Optional[torch.Tensor],
    w2_bias: Optional[torch.Tensor],
    weights_prepared: bool,
    backend: str,
) -> torch.Tensor:
    return torch.empty_like(hidden_states)


def _layer_forward_impl(
    hidden_states: torch.Tensor, router_logits: torch.Tensor, layer_id: int
) -> torch.Tensor:
    out = torch.empty_like(hidden_states)
    return layer_by_id(layer_id).forward_into(out, hidden_states, router_logits)


def _layer_forward_fake(
    hidden_states: torch.Tensor, router_logits: torch.Tensor, layer_id: int
) -> torch.Tensor:
    return torch.empty_like(hidden_states)


def _register_custom_ops() -> bool:
    """torch >= 2.4: torch.library.custom_op with register_fake. False where this torch has none
    (or an early one without `schema`)."""
    custom_op = getattr(torch.library, "custom_op", None)
    if custom_op is None:
        return False
    try:
        fused = custom_op(
            "moekit::fused_experts", _fused_experts_impl, mutates_args=(), schema=FUSED_EXPERTS_SCHEMA
        )
    except TypeError:
        return False
    fused.register_fake(_fused_experts_fake)
    layer = custom_op(
        "moekit::layer_forward", _layer_forward_impl, mutates_args=(), schema=LAYER_FORWARD_SCHEMA
    )
    layer.register_fake(_layer_forward_fake)
    _OPS.extend([fused, layer])
    return True


def _register_library_ops() -> None:
    """Older torch (e.g. Debian's 1.13): torch.library.Library with CPU, CUDA and Meta kernels."""
    library = torch.library.Library("moekit", "DEF")
    library.define("fused_experts" + FUSED_EXPERTS_SCHEMA)
    library.define("layer_forward" + LAYER_FORWARD_SCHEMA)
    for key in ("CPU", "CUDA"):
        library.impl("fused_experts", _fused_experts_impl, key)
        library.impl("layer_forward", _layer_forward_impl, key)
    for key in ("Meta", "AutogradMeta"):  # torch 1.13 has no autograd fallback for meta
        library.impl("fused_experts", _fused_experts_fake, key)
        library.impl("layer_forward", _layer_forward_fake, key)
    _OPS.append(library)


_OPS: list = []  # NOTE: kept alive: these objects own the registrations
# Which registration this torch got: "custom_op" (torch.compile traces the ops through their fake
# implementations) or "library".
REGISTRATION = "custom_op" if _register_custom_ops() else "library"
if REGISTRATION == "library":
    _register_library_ops()

__all__ = ["fused_experts", "prepare_fused_experts_weights", "REGISTRATION"]
