"""moekit.MoELayer: one Mixture-of-Experts layer of the C++ library, called on torch tensors."""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Dict, Optional, Tuple, Union

import torch

from . import _lib
from ._lib import lib
from ._tensors import adopt, device_name, dltensor, dltensor_pointer, dtype_name, managed
from ._tensors import stream_of, torch_dtype

PathLike = Union[str, "os.PathLike[str]"]

# Layers by id, for the torch custom op (ops.py), which cannot take a Python object.
_LAYERS: "weakref.WeakValueDictionary[int, MoELayer]" = weakref.WeakValueDictionary()


def layer_options(
    dtype: Union[str, torch.dtype] = torch.bfloat16,
    device: Union[str, torch.device, None] = "auto",
    backend: str = "auto",
    max_num_tokens: int = 8192,
    tile_config: str = "auto",
    tp_size: int = 1,
    tp_rank: int = 0,
    dp_size: int = 1,
    dp_rank: int = 0,
    enable_ep: bool = False,
    ep_size: Optional[int] = None,
    ep_rank: Optional[int] = None,
    all2all: str = "naive",
) -> _lib.LayerOptions:
    """The C API's moekit_layer_options. ep_size / ep_rank: expert parallelism over ep_size ranks
    of one data-parallel group (tp_size = ep_size, tp_rank = ep_rank, enable_ep)."""
    if ep_size is not None:
        tp_size, tp_rank, enable_ep = ep_size, ep_rank or 0, ep_size > 1
    o = _lib.LayerOptions()
    lib.moekit_layer_options_init(ctypes.byref(o))
    o.dtype = dtype_name(dtype).encode()
    o.device = device_name(device).encode()
    o.backend = backend.encode()
    o.tile_config = tile_config.encode()
    o.max_num_tokens = max_num_tokens
    o.tp_size, o.tp_rank, o.dp_size, o.dp_rank = tp_size, tp_rank, dp_size, dp_rank
    o.enable_ep = 1 if enable_ep else 0
    o.all2all = all2all.encode()
    return o


class MoELayer(torch.nn.Module):
    """A MoE layer: weights held once in the chosen kernel's layout, its router, its plan.

        layer = moekit.MoELayer("qwen3-30b-a3b", device="cuda")      # seeded random weights
        layer = moekit.MoELayer.from_checkpoint("ckpt/", layer=3)     # any quantization scheme
        y = layer(x, router_logits)   # x (M, H), logits (M, E) -> (M, H), on torch's stream

    `model` is a preset name or a HuggingFace config.json (file or directory). Options: dtype,
    device ("auto": the GPU when present), backend, max_num_tokens, tile_config, tp_size, tp_rank,
    dp_size, dp_rank, enable_ep (or ep_size / ep_rank), all2all.
    """

    def __init__(self, model: PathLike, *, seed: int = 0, **options) -> None:  # noqa: ANN003
        super().__init__()
        self._handle = ctypes.c_void_p()
        opts = layer_options(**options)
        lib.moekit_layer_create(
            os.fspath(model).encode(), seed, ctypes.byref(opts), ctypes.byref(self._handle)
        )
        self._finish_init()

    @classmethod
    def from_checkpoint(cls, path: PathLike, layer: int, **options) -> "MoELayer":  # noqa: ANN003
        """MoE layer `layer` of a HuggingFace-layout checkpoint (config.json + safetensors),
        with its quantization (Quark schemes: fp8, int8, mxfp4/6, nvfp4, w4a8, ...)."""
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self._handle = ctypes.c_void_p()
        opts = layer_options(**options)
        lib.moekit_layer_load(
            os.fspath(path).encode(), layer, ctypes.byref(opts), ctypes.byref(self._handle)
        )
        self._finish_init()
        return self

    @classmethod
    def from_weights(
        cls,
        model: PathLike,
        w13: torch.Tensor,
        w2: torch.Tensor,
        *,
        w13_bias: Optional[torch.Tensor] = None,
        w2_bias: Optional[torch.Tensor] = None,
        e_score_correction_bias: Optional[torch.Tensor] = None,
        shared_w13: Optional[torch.Tensor] = None,
        shared_w2: Optional[torch.Tensor] = None,
        router_weight: Optional[torch.Tensor] = None,
        shared_gate: Optional[torch.Tensor] = None,
        router_bias: Optional[torch.Tensor] = None,
        **options,  # noqa: ANN003
    ) -> "MoELayer":
        """A layer over your tensors (unquantized): w13 (E, N1, H) with N1 = 2I ([gate; up]) for
        gated activations, w2 (E, H, I). dtype and device default to w13's.

        NOTE: zero-copy: the layer shares the tensors' memory and rewrites w13 (and w13_bias) in
        place into its kernel's layout; pass clones to keep the originals. Shared experts
        (shared_w13 (2 I_s, H), shared_w2 (H, I_s), shared_gate (1, H) for Qwen2-MoE's per-token
        gate) that fold into the routed experts make the layer copy w13 / w2 once instead.
        router_weight (E, H) and router_bias (E,) (gpt-oss's gate has one), f32 on the CPU, make
        router_logits(x) work."""
        options.setdefault("dtype", w13.dtype)
        options.setdefault("device", w13.device)
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self._handle = ctypes.c_void_p()
        t = _lib.LayerTensors()
        t.struct_size = ctypes.sizeof(t)
        given = dict(
            w13=w13,
            w2=w2,
            w13_bias=w13_bias,
            w2_bias=w2_bias,
            e_score_correction_bias=e_score_correction_bias,
            shared_w13=shared_w13,
            shared_w2=shared_w2,
            router_weight=router_weight,
            shared_gate=shared_gate,
            router_bias=router_bias,
        )
        for name, tensor in given.items():
            setattr(t, name, managed(tensor))
        opts = layer_options(**options)
        lib.moekit_layer_create_from_tensors(
            os.fspath(model).encode(), ctypes.byref(t), ctypes.byref(opts), ctypes.byref(self._handle)
        )
        self._finish_init()
        return self

    def _finish_init(self) -> None:
        info = _lib.LayerInfo()
        info.struct_size = ctypes.sizeof(info)
        lib.moekit_layer_get_info(self._handle, ctypes.byref(info))
        self.num_experts: int = info.num_experts
        self.num_local_experts: int = info.num_local_experts
        self.first_local_expert: int = info.first_local_expert
        self.top_k: int = info.top_k
        self.hidden_size: int = info.hidden_size
        self.intermediate_size: int = info.intermediate_size
        self.max_num_tokens: int = info.max_num_tokens
        self.dtype: torch.dtype = torch_dtype(info.dtype.code, info.dtype.bits)
        self.device: torch.device = (
            torch.device("cuda", info.device.device_id)
            if info.device.device_type == _lib.KDLCUDA
            else torch.device("cpu")
        )
        self.is_quantized = bool(info.is_quantized)
        self.is_monolithic = bool(info.is_monolithic)
        self.has_shared_experts = bool(info.has_shared_experts)
        self.has_router_weight = bool(info.has_router_weight)
        self.tolerance: float = info.tolerance_rel_l2
        self.layer_id = id(self)
        _LAYERS[self.layer_id] = self

    def close(self) -> None:
        """Releases the layer now (otherwise when it is garbage collected)."""
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value:
            lib.moekit_layer_destroy(handle)
            handle.value = None

    def __del__(self) -> None:
        self.close()

    @property
    def handle(self) -> ctypes.c_void_p:
        if not self._handle.value:
            raise _lib.MoekitError("moekit: the layer was closed")
        return self._handle

    # ---- text ---------------------------------------------------------------------------------
    def _text(self, what: int) -> str:
        out = ctypes.c_void_p()
        lib.moekit_layer_get_text(self.handle, what, ctypes.byref(out))
        return _lib.take_string(out)

    def explain(self) -> str:
        """The model, deployment, scheme and plan (what `moekit explain` prints)."""
        return self._text(_lib.TEXT_EXPLAIN)

    @property
    def plan(self) -> str:
        return self._text(_lib.TEXT_PLAN)

    @property
    def model_summary(self) -> str:
        return self._text(_lib.TEXT_MODEL)

    @property
    def scheme(self) -> str:
        return self._text(_lib.TEXT_SCHEME)

    @property
    def backend(self) -> str:
        return self._text(_lib.TEXT_BACKEND)

    @property
    def experts_name(self) -> str:
        return self._text(_lib.TEXT_EXPERTS)

    def extra_repr(self) -> str:
        return f"{self.model_summary}, backend={self.backend}, device={self.device}"

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden_states (M, H), router_logits (M, E) -> (M, H), on torch's current stream."""
        if _compiling():
            return torch.ops.moekit.layer_forward(hidden_states, router_logits, self.layer_id)
        out = torch.empty_like(hidden_states, memory_format=torch.contiguous_format)
        self.forward_into(out, hidden_states, router_logits)
        return out

    def forward_into(
        self, out: torch.Tensor, hidden_states: torch.Tensor, router_logits: torch.Tensor
    ) -> torch.Tensor:
        """Writes into `out` (M, H): allocates nothing (CUDA-graph capturable)."""
        device = hidden_states.device
        _forward(
            self._handle,
            dltensor_pointer(hidden_states),
            dltensor_pointer(router_logits),
            dltensor_pointer(out),
            stream_of(device) if device.type == "cuda" else None,
        )
        return out

    def forward_routed(
        self,
        hidden_states: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        out: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """With routing done: topk_ids (M, k) int32/int64, topk_weights (M, k) float32."""
        if out is None:
            out = torch.empty_like(hidden_states, memory_format=torch.contiguous_format)
        views = [dltensor(t) for t in (hidden_states, topk_ids, topk_weights, out)]
        lib.moekit_layer_forward_routed(
            self.handle, *(v[1] for v in views), stream_of(hidden_states.device)
        )
        return out

    def route(
        self, hidden_states: torch.Tensor, router_logits: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The layer's router: (topk_weights (M, k) float32, topk_ids (M, k) int32)."""
        M = hidden_states.shape[0]
        weights = torch.empty(M, self.top_k, dtype=torch.float32, device=router_logits.device)
        ids = torch.empty(M, self.top_k, dtype=torch.int32, device=router_logits.device)
        views = [dltensor(t) for t in (hidden_states, router_logits, weights, ids)]
        lib.moekit_layer_route(self.handle, *(v[1] for v in views), stream_of(router_logits.device))
        return weights, ids

    def router_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """x (M, H) on the CPU -> logits (M, E) float32 through the checkpoint's gate weight."""
        x, x_ptr = dltensor(hidden_states)
        out = ctypes.c_void_p()
        lib.moekit_layer_router_logits(self.handle, x_ptr, ctypes.byref(out))
        return adopt(out)

    def expert_reference(self, expert: int) -> Dict[str, Optional[torch.Tensor]]:
        """Local expert `expert` as float32 CPU tensors in the standard layout, dequantized:
        {"w13": (N1, H), "w2": (H, I), "w13_bias": (N1,) or None, "w2_bias": (H,) or None}."""
        t = _lib.ExpertTensors()
        t.struct_size = ctypes.sizeof(t)
        lib.moekit_layer_expert_reference(self.handle, expert, ctypes.byref(t))
        return {name: adopt(getattr(t, name)) for name in ("w13", "w2", "w13_bias", "w2_bias")}

    def benchmark(
        self, hidden_states: torch.Tensor, router_logits: torch.Tensor, iterations: int = 100
    ) -> Tuple[float, float]:
        """The C++ layer's own time per forward, from C++: (host µs until queued, wall µs)."""
        out = torch.empty_like(hidden_states)
        views = [dltensor(t) for t in (hidden_states, router_logits, out)]
        host, wall = ctypes.c_double(), ctypes.c_double()
        lib.moekit_layer_benchmark(
            self.handle,
            *(v[1] for v in views),
            stream_of(hidden_states.device),
            iterations,
            ctypes.byref(host),
            ctypes.byref(wall),
        )
        return host.value, wall.value


def _never() -> bool:
    return False


# Whether torch.compile (dynamo) is tracing: the eager path calls the library directly, a traced
# one goes through the custom op (ops.py).
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or getattr(
    getattr(torch, "_dynamo", None), "is_compiling", _never
)
_forward = lib.moekit_layer_forward


def layer_by_id(layer_id: int) -> MoELayer:
    layer = _LAYERS.get(layer_id)
    if layer is None:
        raise _lib.MoekitError(f"moekit: no live MoELayer with id {layer_id}")
    return layer

