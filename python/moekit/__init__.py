"""moekit for PyTorch: the C++ Mixture-of-Experts library through its C API (ctypes + DLPack).

    import torch, moekit
    layer = moekit.MoELayer("qwen3-30b-a3b", dtype=torch.bfloat16, device="cuda")
    y = layer(x, router_logits)                     # zero-copy, on torch's current stream
    print(moekit.explain("deepseek-v3", device="h200", enable_ep=True, tp_size=8))
    y = moekit.fused_experts(x, w1, w2, topk_weights, topk_ids)   # vLLM's functional form

The shared library libmoekit_c.so is found through MOEKIT_LIBRARY, next to this package, or in
the build/ folder of the source tree (see _lib.py).
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional, Union

from . import _lib
from ._lib import MoekitError, OutOfMemoryError, UnsupportedError, lib, library_path
from .layer import MoELayer, layer_options
from .ops import REGISTRATION, fused_experts, prepare_fused_experts_weights

__version__: str = lib.moekit_version().decode()


def explain(
    model: Union[str, "os.PathLike[str]", MoELayer],
    quantization: Optional[str] = None,
    **options,  # noqa: ANN003
) -> str:
    """The plan moekit makes for a deployment, with every rejected candidate and its reason.

    `model`: a preset name, a HuggingFace config.json, a checkpoint directory (its own
    quantization_config), or a MoELayer (its plan). `quantization`: a `moekit make-fixture` scheme
    name ("fp8_block128", "nvfp4", ...). Options as for MoELayer; device may also name a GPU that
    is not present ("h200", "h100")."""
    if isinstance(model, MoELayer):
        return model.explain()
    opts = layer_options(**options)
    text = ctypes.c_void_p()
    lib.moekit_explain(
        os.fspath(model).encode(), _lib.encode(quantization), ctypes.byref(opts), ctypes.byref(text)
    )
    return _lib.take_string(text)


def write_fixture_checkpoint(
    path: Union[str, "os.PathLike[str]"], scheme: str = "bf16", model: str = "tiny", seed: int = 0
) -> None:
    """A small checkpoint (what `moekit make-fixture` writes): scheme "bf16", "fp8_block128",
    "nvfp4", ...; model "tiny", "tiny-mixtral", "tiny-deepseek"."""
    lib.moekit_write_fixture_checkpoint(os.fspath(path).encode(), scheme.encode(), model.encode(), seed)


def built_with_cuda() -> bool:
    return bool(lib.moekit_built_with_cuda())


def cuda_device_count() -> int:
    return int(lib.moekit_cuda_device_count())


__all__ = [
    "MoELayer",
    "MoekitError",
    "OutOfMemoryError",
    "REGISTRATION",
    "UnsupportedError",
    "built_with_cuda",
    "cuda_device_count",
    "explain",
    "fused_experts",
    "library_path",
    "prepare_fused_experts_weights",
    "write_fixture_checkpoint",
]
