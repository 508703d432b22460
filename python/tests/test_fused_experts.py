"""moekit.fused_experts (vLLM's functional form) and the torch custom ops on the CPU."""

from __future__ import annotations

import pytest
import torch

import moekit
from conftest import reference_experts, rel_l2, softmax_topk, torch_version

E, H, I, K = 8, 64, 32, 2


def problem(M: int, activation: str = "silu", dtype: torch.dtype = torch.float32, seed: int = 0,
            bias: bool = False, k: int = K):  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    n1 = 2 * I if not activation.endswith("_no_mul") else I
    x = (torch.rand(M, H, generator=g) * 2 - 1).to(dtype)
    w1 = ((torch.rand(E, n1, H, generator=g) * 2 - 1) / H**0.5).to(dtype)
    w2 = ((torch.rand(E, H, I, generator=g) * 2 - 1) / I**0.5).to(dtype)
    topk_weights, topk_ids = softmax_topk(torch.randn(M, E, generator=g), k)
    b1 = (torch.rand(E, n1, generator=g) * 0.2 - 0.1).to(dtype) if bias else None
    b2 = (torch.rand(E, H, generator=g) * 0.2 - 0.1).to(dtype) if bias else None
    return x, w1, w2, topk_weights, topk_ids, b1, b2


TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("activation", ["silu", "gelu", "swigluoai", "relu2_no_mul"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(activation: str, dtype: torch.dtype) -> None:
    x, w1, w2, tw, ti, _, _ = problem(33, activation, dtype)
    out = moekit.fused_experts(x, w1, w2, tw, ti, activation=activation)
    ref = reference_experts(x, w1, w2, tw, ti, activation)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_l2(out, ref) <= TOL[dtype]


def test_int32_ids_biases_and_out() -> None:
    x, w1, w2, tw, ti, b1, b2 = problem(7, bias=True)
    out = torch.full_like(x, float("nan"))
    result = moekit.fused_experts(x, w1, w2, tw, ti.int(), w1_bias=b1, w2_bias=b2, out=out)
    assert result is out and not out.isnan().any()
    assert rel_l2(out, reference_experts(x, w1, w2, tw, ti, "silu", b1, b2)) <= 1e-5


def test_inplace_and_zero_copy() -> None:
    x, w1, w2, tw, ti, _, _ = problem(5)
    ref = reference_experts(x, w1, w2, tw, ti)
    pointers = [t.data_ptr() for t in (x, w1, w2, tw, ti)]
    result = moekit.fused_experts(x, w1, w2, tw, ti, inplace=True)
    assert result is x and [t.data_ptr() for t in (x, w1, w2, tw, ti)] == pointers
    assert rel_l2(x, ref) <= 1e-5


def test_expert_map() -> None:
    # This rank holds global experts 4..7 as local 0..3; the others contribute nothing.
    x, w1, w2, tw, ti, _, _ = problem(16)
    expert_map = torch.full((E,), -1, dtype=torch.int32)
    expert_map[4:] = torch.arange(4, dtype=torch.int32)
    out = moekit.fused_experts(x, w1[4:].contiguous(), w2[4:].contiguous(), tw, ti,
                               global_num_experts=E, expert_map=expert_map)  # fmt: skip
    ref = reference_experts(x, w1[4:], w2[4:], tw, ti, expert_map=expert_map)
    assert rel_l2(out, ref) <= 1e-5


def test_router_weight_on_input() -> None:
    x, w1, w2, tw, ti, _, _ = problem(9, k=1)
    out = moekit.fused_experts(x, w1, w2, tw, ti, apply_router_weight_on_input=True)
    assert rel_l2(out, reference_experts(x, w1, w2, tw, ti, on_input=True)) <= 1e-5


def test_zero_tokens() -> None:
    x, w1, w2, tw, ti, _, _ = problem(0)
    assert moekit.fused_experts(x, w1, w2, tw, ti).shape == (0, H)


def test_prepare_weights_on_the_cpu_is_the_standard_layout() -> None:
    x, w1, w2, tw, ti, _, _ = problem(4)
    before = w1.clone()
    assert moekit.prepare_fused_experts_weights(w1, w2, top_k=K) == "standard"
    assert torch.equal(w1, before)
    out = moekit.fused_experts(x, w1, w2, tw, ti, weights_prepared=True)
    assert rel_l2(out, reference_experts(x, w1, w2, tw, ti)) <= 1e-5


def test_errors() -> None:
    x, w1, w2, tw, ti, _, _ = problem(4)
    with pytest.raises(moekit.MoekitError, match="activation silu needs 64"):
        moekit.fused_experts(x, w1[:, :48].contiguous(), w2, tw, ti)
    with pytest.raises(moekit.MoekitError, match="'w13' has dtype bf16"):
        moekit.fused_experts(x, w1.bfloat16(), w2, tw, ti)
    with pytest.raises(moekit.MoekitError, match="topk_weights"):
        moekit.fused_experts(x, w1, w2, tw.double(), ti)
    with pytest.raises(moekit.MoekitError, match="unknown"):
        moekit.fused_experts(x, w1, w2, tw, ti, activation="swish")
    with pytest.raises(moekit.MoekitError, match="give the expert_map"):
        moekit.fused_experts(x, w1, w2, tw, ti, global_num_experts=16)
    with pytest.raises(moekit.MoekitError, match="same memory"):
        moekit.fused_experts(x, w1, w2, tw, ti, out=x)
    with pytest.raises(NotImplementedError, match="use_fp8_w8a8"):
        moekit.fused_experts(x, w1, w2, tw, ti, use_fp8_w8a8=True)
    with pytest.raises(TypeError, match="unexpected"):
        moekit.fused_experts(x, w1, w2, tw, ti, no_such_argument=1)


def test_torch_ops_registration() -> None:
    x, w1, w2, tw, ti, _, _ = problem(6)
    out = torch.ops.moekit.fused_experts(x, w1, w2, tw, ti, "silu", False, -1, None, None, None, False, "auto")
    assert torch.equal(out, moekit.fused_experts(x, w1, w2, tw, ti))
    layer = moekit.MoELayer("tiny", device="cpu", dtype=torch.float32)
    lx = torch.rand(3, 64)
    logits = torch.randn(3, 8)
    assert torch.equal(torch.ops.moekit.layer_forward(lx, logits, layer.layer_id), layer(lx, logits))


def test_meta_tensors_give_the_output_shape() -> None:
    # What torch.compile's fake tensors see: the shape without running anything.
    x, w1, w2, tw, ti, _, _ = (t.to("meta") if t is not None else None for t in problem(6))
    out = torch.ops.moekit.fused_experts(x, w1, w2, tw, ti, "silu", False, -1, None, None, None, False, "auto")
    assert out.device.type == "meta" and out.shape == (6, H)


needs_compile = pytest.mark.skipif(
    torch_version() < (2, 4),
    reason=f"torch.compile of the custom ops needs torch >= 2.4 (torch.library.custom_op); this is "
    f"torch {torch.__version__}, where the ops are registered with torch.library.Library instead",
)


class FusedModule(torch.nn.Module):
    def __init__(self, w1: torch.Tensor, w2: torch.Tensor, layer: moekit.MoELayer) -> None:
        super().__init__()
        self.w1, self.w2, self.layer = w1, w2, layer

    def forward(self, x: torch.Tensor, logits: torch.Tensor, lx: torch.Tensor) -> torch.Tensor:
        w, ids = torch.topk(torch.softmax(logits, dim=-1), K, dim=-1)
        y = moekit.fused_experts(x, self.w1, self.w2, w / w.sum(-1, keepdim=True), ids)
        return torch.relu(y) + self.layer(lx, logits).sum()


@needs_compile
def test_torch_compile_cpu() -> None:
    x, w1, w2, _, _, _, _ = problem(8)
    layer = moekit.MoELayer("tiny", device="cpu", dtype=torch.float32)
    logits = torch.randn(8, E)
    lx = torch.rand(8, 64)
    module = FusedModule(w1, w2, layer)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, logits, lx), module(x, logits, lx))


@needs_compile
def test_opcheck() -> None:
    # torch's own checks of a custom op: schema, fake (meta) implementation, AOT dispatch.
    x, w1, w2, tw, ti, _, _ = problem(6)
    args = (x, w1, w2, tw, ti, "silu", False, -1, None, None, None, False, "auto")
    torch.library.opcheck(torch.ops.moekit.fused_experts.default, args)
    layer = moekit.MoELayer("tiny", device="cpu", dtype=torch.float32)
    torch.library.opcheck(
        torch.ops.moekit.layer_forward.default, (torch.rand(3, 64), torch.randn(3, 8), layer.layer_id)
    )
