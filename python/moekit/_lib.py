"""libmoekit_c.so and the ctypes mirror of its header, include/moekit/moekit_c.h.

The library is looked up, in this order:
  1. the environment variable MOEKIT_LIBRARY (the file, or the folder that holds it);
  2. next to this package (where `cmake --install` puts it);
  3. the build/ folder of the source tree this package sits in (python/moekit -> build/).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from ctypes import POINTER, c_char_p, c_double, c_int32, c_int64, c_size_t, c_uint8
from ctypes import c_uint16, c_uint32, c_uint64, c_void_p
from typing import List, Optional

LIBRARY_NAME = "libmoekit_c.so"
C_API_VERSION = 1
STREAM_LEGACY = 1  # MOEKIT_STREAM_LEGACY: cudaStreamLegacy

# moekit_status
OK = 0
ERROR = 1
ERROR_UNSUPPORTED = 2
ERROR_OUT_OF_MEMORY = 3
ERROR_INTERNAL = 4

# moekit_layer_text
TEXT_EXPLAIN, TEXT_PLAN, TEXT_MODEL, TEXT_SCHEME, TEXT_BACKEND, TEXT_EXPERTS, TEXT_TOLERANCE = range(7)


class MoekitError(RuntimeError):
    """A moekit call failed; the message is the library's."""


class UnsupportedError(MoekitError):
    """No experts backend (or a forced one) can serve the deployment; the message lists why."""


class OutOfMemoryError(MoekitError, MemoryError):
    """The library could not allocate."""


_ERRORS = {ERROR_UNSUPPORTED: UnsupportedError, ERROR_OUT_OF_MEMORY: OutOfMemoryError}


# ---- DLPack (the 0.6+ ABI: DLTensor and DLManagedTensor have not changed since) --------------
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, POINTER(DLManagedTensor))),
]

KDLCPU = 1
KDLCUDA = 2


# ---- the header's structs ----------------------------------------------------------------------
class LayerOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("dtype", c_char_p),
        ("device", c_char_p),
        ("backend", c_char_p),
        ("tile_config", c_char_p),
        ("max_num_tokens", c_int64),
        ("tp_size", c_int32),
        ("tp_rank", c_int32),
        ("dp_size", c_int32),
        ("dp_rank", c_int32),
        ("enable_ep", c_int32),
        ("all2all", c_char_p),
    ]


class LayerTensors(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32)] + [
        (name, c_void_p)
        for name in (
            "w13",
            "w2",
            "w13_bias",
            "w2_bias",
            "e_score_correction_bias",
            "shared_w13",
            "shared_w2",
            "router_weight",
            "shared_gate",
            "router_bias",
        )
    ]


class LayerInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_experts", c_int32),
        ("num_local_experts", c_int32),
        ("first_local_expert", c_int32),
        ("top_k", c_int32),
        ("hidden_size", c_int64),
        ("intermediate_size", c_int64),
        ("max_num_tokens", c_int64),
        ("dtype", DLDataType),
        ("device", DLDevice),
        ("is_quantized", c_int32),
        ("is_monolithic", c_int32),
        ("has_shared_experts", c_int32),
        ("has_router_weight", c_int32),
        ("tolerance_rel_l2", c_double),
    ]


class ExpertTensors(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32)] + [
        (name, c_void_p) for name in ("w13", "w2", "w13_bias", "w2_bias")
    ]


class FusedExpertsArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("hidden_states", c_void_p),
        ("w13", c_void_p),
        ("w2", c_void_p),
        ("topk_weights", c_void_p),
        ("topk_ids", c_void_p),
        ("output", c_void_p),
        ("activation", c_char_p),
        ("apply_router_weight_on_input", c_int32),
        ("global_num_experts", c_int64),
        ("expert_map", c_void_p),
        ("w13_bias", c_void_p),
        ("w2_bias", c_void_p),
        ("weights_prepared", c_int32),
        ("backend", c_char_p),
    ]


_STRUCTS = {
    "moekit_layer_options": LayerOptions,
    "moekit_layer_tensors": LayerTensors,
    "moekit_layer_info": LayerInfo,
    "moekit_expert_tensors": ExpertTensors,
    "moekit_fused_experts_args": FusedExpertsArgs,
    "DLTensor": DLTensor,
    "DLManagedTensor": DLManagedTensor,
}


def candidate_paths() -> List[pathlib.Path]:
    """Where the library is looked for, in order."""
    here = pathlib.Path(__file__).resolve().parent
    paths = []
    env = os.environ.get("MOEKIT_LIBRARY")
    if env:
        p = pathlib.Path(env)
        paths.append(p / LIBRARY_NAME if p.is_dir() else p)
    paths.append(here / LIBRARY_NAME)
    paths.append(here.parent.parent / "build" / LIBRARY_NAME)
    return paths


def _load() -> ctypes.CDLL:
    tried = []
    for path in candidate_paths():
        if path.is_file():
            return ctypes.CDLL(str(path))
        tried.append(str(path))
        if os.environ.get("MOEKIT_LIBRARY") and len(tried) == 1:
            raise ImportError(f"moekit: MOEKIT_LIBRARY names {path}, which does not exist")
    raise ImportError(
        "moekit: cannot find " + LIBRARY_NAME + " (tried " + ", ".join(tried) + "); build it "
        "(./scripts/build.sh, or `cmake --build build --target moekit_c`) or set MOEKIT_LIBRARY "
        "to its path"
    )


lib = _load()
library_path: str = lib._name


def _errcheck(status: int, func, args):  # noqa: ANN001 (ctypes' errcheck protocol)
    if status != OK:
        message = lib.moekit_last_error().decode("utf-8", "replace")
        raise _ERRORS.get(status, MoekitError)(message)
    return status


def _declare(name: str, argtypes: list, restype=c_int32, check: bool = True) -> None:  # noqa: ANN001
    f = getattr(lib, name)
    f.argtypes = argtypes
    f.restype = restype
    if check:
        f.errcheck = _errcheck


_P = c_void_p  # pointers to structs and tensors travel as plain addresses
_declare("moekit_version", [], c_char_p, check=False)
_declare("moekit_c_api_version", [], c_int32, check=False)
_declare("moekit_built_with_cuda", [], c_int32, check=False)
_declare("moekit_cuda_device_count", [], c_int32, check=False)
_declare("moekit_last_error", [], c_char_p, check=False)
_declare("moekit_string_free", [c_void_p], None, check=False)
_declare("moekit_struct_size", [c_char_p], c_size_t, check=False)
_declare("moekit_layer_options_init", [_P], None, check=False)
_declare("moekit_layer_create", [c_char_p, c_uint64, _P, _P])
_declare("moekit_layer_load", [c_char_p, c_int32, _P, _P])
_declare("moekit_layer_create_from_tensors", [c_char_p, _P, _P, _P])
_declare("moekit_layer_destroy", [c_void_p], None, check=False)
_declare("moekit_layer_get_info", [c_void_p, _P])
_declare("moekit_layer_get_text", [c_void_p, c_int32, _P])
_declare("moekit_layer_forward", [c_void_p, _P, _P, _P, c_void_p])
_declare("moekit_layer_forward_routed", [c_void_p, _P, _P, _P, _P, c_void_p])
_declare("moekit_layer_route", [c_void_p, _P, _P, _P, _P, c_void_p])
_declare("moekit_layer_router_logits", [c_void_p, _P, _P])
_declare("moekit_layer_expert_reference", [c_void_p, c_int64, _P])
_declare("moekit_layer_benchmark", [c_void_p, _P, _P, _P, c_void_p, c_int32, _P, _P])
_declare("moekit_explain", [c_char_p, c_char_p, _P, _P])
_declare("moekit_write_fixture_checkpoint", [c_char_p, c_char_p, c_char_p, c_uint64])
_declare("moekit_fused_experts", [_P, c_void_p])
_declare("moekit_fused_experts_prepare_weights", [_P, c_void_p, _P])

if lib.moekit_c_api_version() != C_API_VERSION:
    raise ImportError(
        f"moekit: {library_path} implements C API version {lib.moekit_c_api_version()}, this "
        f"package needs {C_API_VERSION}"
    )
for _name, _struct in _STRUCTS.items():
    _size = lib.moekit_struct_size(_name.encode())
    if _size != ctypes.sizeof(_struct):
        raise ImportError(
            f"moekit: struct {_name} is {_size} bytes in {library_path} but {ctypes.sizeof(_struct)} "
            "in this package: the package and the library do not match"
        )


def take_string(pointer: c_void_p) -> str:
    """A library-allocated char* as str, freed."""
    try:
        return ctypes.string_at(pointer.value).decode("utf-8", "replace") if pointer.value else ""
    finally:
        lib.moekit_string_free(pointer)


def encode(value: Optional[str]) -> Optional[bytes]:
    return None if value is None else str(value).encode()
