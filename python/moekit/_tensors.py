"""torch tensors to and from DLPack for the C API, without copying (torch.utils.dlpack)."""

from __future__ import annotations

import ctypes
from typing import Dict, Optional, Tuple, Union

import torch
import torch.utils.dlpack

from ._lib import STREAM_LEGACY, DLTensor

_legacy_to_dlpack = getattr(torch.utils.dlpack, "to_dlpack", None)
_from_dlpack = torch.utils.dlpack.from_dlpack


def _to_dlpack(tensor: torch.Tensor) -> object:
    """A "dltensor" capsule of the tensor, without any stream synchronization."""
    if _legacy_to_dlpack is not None:
        return _legacy_to_dlpack(tensor)
    return tensor.__dlpack__(stream=-1) if tensor.is_cuda else tensor.__dlpack__()


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# NOTE: PyCapsule_New keeps this pointer: the name must live as long as the capsules.
_DLTENSOR = b"dltensor"

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def dltensor(tensor: torch.Tensor) -> Tuple[object, int]:
    """(capsule, DLTensor*) of a tensor for one call: the pointer is valid while the capsule lives.

    The capsule is never consumed, so torch releases its export when the capsule goes away. The
    DLManagedTensor starts with its DLTensor: one address serves as both."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    capsule = _to_dlpack(tensor)
    return capsule, _capsule_pointer(capsule, _DLTENSOR)


# DLTensor descriptors by (data pointer, shape, strides, dtype, device): a descriptor only
# describes memory, so one made from torch's DLPack export serves every later call on the same
# memory with the same layout (the caller's tensor keeps the memory alive during each call). It
# saves the export on the hot path (weights, static buffers, reused allocations).
_DESCRIPTORS: Dict[tuple, Tuple[DLTensor, object, object, int]] = {}
_MAX_DESCRIPTORS = 4096


def dltensor_pointer(tensor: torch.Tensor) -> int:
    """A DLTensor* describing `tensor`, valid while the tensor's memory is (borrowed use)."""
    key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device)
    hit = _DESCRIPTORS.get(key)
    if hit is not None:
        return hit[3]
    capsule, pointer = dltensor(tensor)
    src = DLTensor.from_address(pointer)
    d = DLTensor()
    ctypes.memmove(ctypes.addressof(d), pointer, ctypes.sizeof(DLTensor))
    shape = (ctypes.c_int64 * src.ndim)(*src.shape[: src.ndim])
    strides = (ctypes.c_int64 * src.ndim)(*src.strides[: src.ndim]) if src.strides else None
    d.shape = shape
    d.strides = strides
    del capsule
    if len(_DESCRIPTORS) >= _MAX_DESCRIPTORS:
        _DESCRIPTORS.clear()
    _DESCRIPTORS[key] = (d, shape, strides, ctypes.addressof(d))
    return ctypes.addressof(d)


def pointer_or_none(tensor: Optional[torch.Tensor]) -> Optional[int]:
    return None if tensor is None else dltensor_pointer(tensor)


def managed(tensor: Optional[torch.Tensor]) -> Optional[int]:
    """A DLManagedTensor* the C API takes over (it calls the deleter), or None."""
    if tensor is None:
        return None
    capsule = _to_dlpack(tensor.detach())
    pointer = _capsule_pointer(capsule, _DLTENSOR)
    # Renamed as DLPack consumers do, so the capsule's destructor leaves the tensor to the library.
    ctypes.pythonapi.PyCapsule_SetName(ctypes.py_object(capsule), ctypes.c_char_p(b"used_dltensor"))
    return pointer


ctypes.pythonapi.PyCapsule_SetName.restype = ctypes.c_int
ctypes.pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


def adopt(pointer: Union[int, ctypes.c_void_p, None]) -> Optional[torch.Tensor]:
    """A DLManagedTensor* returned by the library as a torch tensor (torch calls its deleter)."""
    value = pointer.value if isinstance(pointer, ctypes.c_void_p) else pointer
    if not value:
        return None
    return _from_dlpack(_capsule_new(value, _DLTENSOR, None))


def stream_of(device: torch.device) -> Optional[int]:
    """torch's current stream on `device` as the C API's stream argument (None on the CPU)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        handle = _raw_stream(index)
    else:
        handle = torch.cuda.current_stream(index).cuda_stream
    # torch's default stream is the legacy default stream: handle 0, which moekit would read as
    # "the layer's own stream".
    return handle if handle else STREAM_LEGACY


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
_DL_TO_TORCH = {
    (2, 16): torch.float16,  # kDLFloat
    (2, 32): torch.float32,
    (2, 64): torch.float64,
    (4, 16): torch.bfloat16,  # kDLBfloat
    (0, 8): torch.int8,  # kDLInt
    (0, 32): torch.int32,
    (0, 64): torch.int64,
    (1, 8): torch.uint8,  # kDLUInt
}


def dtype_name(dtype: Union[str, torch.dtype]) -> str:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"moekit: dtype {dtype} is not supported (bfloat16, float16, float32)")
        return _DTYPE_NAMES[dtype]
    return str(dtype)


def torch_dtype(code: int, bits: int) -> torch.dtype:
    return _DL_TO_TORCH[(code, bits)]


def device_name(device: Union[str, torch.device, None]) -> str:
    if device is None:
        return "auto"
    if isinstance(device, torch.device):
        if device.type == "cuda":
            return f"cuda:{device.index}" if device.index is not None else "cuda"
        return device.type
    return str(device)
