"""moekit on the GPU (an H200 with torch >= 2.4): outputs against the float64 plain-torch reference,
zero-copy, CUDA-graph capture and replay, torch.compile, and the per-call overhead table.
Every test skips with the reason when no CUDA GPU (or no CUDA build of moekit) is present."""

from __future__ import annotations

import pytest
import torch

import moekit
from conftest import gpu_skip_reason, reference_experts, rel_l2, torch_version
from overhead import overhead_table

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason())),
]

needs_custom_op = pytest.mark.skipif(
    torch_version() < (2, 4),
    reason=f"torch.compile of moekit's ops needs torch >= 2.4 (this is {torch.__version__})",
)

ACTIVATION = {"tiny": "silu", "small": "silu", "small-gpt-oss": "swigluoai"}


def experts_of(layer: moekit.MoELayer, device: torch.device):
    """The layer's experts read back in the standard layout: w13, w2, b13, b2 on `device`."""
    experts = [layer.expert_reference(e) for e in range(layer.num_local_experts)]

    def stack(name: str):
        if experts[0][name] is None:
            return None
        return torch.stack([e[name] for e in experts]).to(device)

    return stack("w13"), stack("w2"), stack("w13_bias"), stack("w2_bias")


def check_layer(layer: moekit.MoELayer, M: int, preset: str, seed: int = 0) -> torch.Tensor:
    device = layer.device
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(M, layer.hidden_size, generator=g) * 2 - 1).to(layer.dtype).to(device)
    logits = torch.randn(M, layer.num_experts, generator=g).to(device)
    out = layer(x, logits)
    weights, ids = layer.route(x, logits)
    w13, w2, b13, b2 = experts_of(layer, device)
    ref = reference_experts(x, w13, w2, weights, ids, ACTIVATION[preset], b13, b2)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert rel_l2(out, ref) <= layer.tolerance, (preset, M, rel_l2(out, ref), layer.tolerance)
    return out


@pytest.mark.parametrize("preset", ["tiny", "small", "small-gpt-oss"])
@pytest.mark.parametrize("M", [1, 37, 256])
def test_layer_matches_reference_on_a_side_stream(gpu: torch.device, preset: str, M: int) -> None:
    layer = moekit.MoELayer(preset, device=gpu, seed=1)
    assert layer.device.type == "cuda" and layer.backend.startswith("sm90"), layer.explain()
    stream = torch.cuda.Stream(gpu)
    with torch.cuda.stream(stream):
        check_layer(layer, M, preset)


def test_layer_on_torch_default_stream(gpu: torch.device) -> None:
    # torch's default stream is CUDA's legacy default stream (handle 0): moekit gets
    # MOEKIT_STREAM_LEGACY, never "the layer's own stream".
    assert torch.cuda.current_stream(gpu).cuda_stream == 0
    check_layer(moekit.MoELayer("small", device=gpu, seed=2), 64, "small")


def test_zero_tokens_gpu(gpu: torch.device) -> None:
    layer = moekit.MoELayer("tiny", device=gpu)
    out = layer(torch.empty(0, 64, dtype=torch.bfloat16, device=gpu), torch.empty(0, 8, device=gpu))
    assert out.shape == (0, 64)


def test_zero_copy_gpu(gpu: torch.device) -> None:
    g = torch.Generator().manual_seed(0)
    w13 = ((torch.rand(8, 192, 64, generator=g) * 2 - 1) / 8).bfloat16().to(gpu)
    w2 = ((torch.rand(8, 64, 96, generator=g) * 2 - 1) / 10).bfloat16().to(gpu)
    original = w13.clone()
    layer = moekit.MoELayer.from_weights("tiny", w13, w2)
    # The layer rewrote the caller's w13 in place into its kernel's layout (one copy of the weights),
    # and reads it back in the standard layout.
    assert torch.equal(layer.expert_reference(3)["w13"], original[3].float().cpu())
    if "standard layout" not in layer.plan:
        assert not torch.equal(w13, original)
    x = torch.rand(5, 64, device=gpu).bfloat16()
    logits = torch.randn(5, 8, device=gpu)
    out = torch.empty_like(x)
    pointers = (x.data_ptr(), logits.data_ptr(), out.data_ptr())
    assert layer.forward_into(out, x, logits) is out
    assert (x.data_ptr(), logits.data_ptr(), out.data_ptr()) == pointers
    before = out.clone()
    w2.mul_(2.0)  # the layer reads w2 where it lies
    layer.forward_into(out, x, logits)
    torch.testing.assert_close(out, 2.0 * before, rtol=2e-2, atol=2e-2)


def test_cuda_graph_capture_and_replay(gpu: torch.device) -> None:
    layer = moekit.MoELayer("small", device=gpu, seed=3, max_num_tokens=64)
    x = torch.rand(48, 256, device=gpu).bfloat16()
    logits = torch.randn(48, 16, device=gpu)
    out = torch.empty_like(x)
    stream = torch.cuda.Stream(gpu)
    stream.wait_stream(torch.cuda.current_stream(gpu))
    with torch.cuda.stream(stream):  # warm-up outside the capture
        for _ in range(2):
            layer.forward_into(out, x, logits)
    torch.cuda.current_stream(gpu).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.forward_into(out, x, logits)
        allocated = layer(x, logits)  # the module call, its output from the graph's pool
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x.copy_((torch.rand(48, 256, generator=g) * 2 - 1).bfloat16())
        logits.copy_(torch.randn(48, 16, generator=g))
        graph.replay()
        eager = layer(x, logits)
        torch.cuda.synchronize()
        assert torch.equal(out, eager) and torch.equal(allocated, eager)  # bitwise
    check_layer(layer, 48, "small")


def fused_problem(device: torch.device, M: int = 40, E: int = 16, H: int = 256, I: int = 128, k: int = 4):
    g = torch.Generator().manual_seed(5)
    x = (torch.rand(M, H, generator=g) * 2 - 1).bfloat16().to(device)
    w1 = ((torch.rand(E, 2 * I, H, generator=g) * 2 - 1) / H**0.5).bfloat16().to(device)
    w2 = ((torch.rand(E, H, I, generator=g) * 2 - 1) / I**0.5).bfloat16().to(device)
    probs = torch.softmax(torch.randn(M, E, generator=g), -1)
    tw, ti = torch.topk(probs, k, dim=-1)
    return x, w1, w2, (tw / tw.sum(-1, keepdim=True)).to(device), ti.to(device)


def test_fused_experts_standard_and_prepared_weights(gpu: torch.device) -> None:
    x, w1, w2, tw, ti = fused_problem(gpu)
    ref = reference_experts(x, w1, w2, tw, ti)
    standard = moekit.fused_experts(x, w1, w2, tw, ti)  # a copy rewritten per call if needed
    assert rel_l2(standard, ref) <= 1.6e-2
    prepared_w1 = w1.clone()
    layout = moekit.prepare_fused_experts_weights(prepared_w1, w2, top_k=ti.shape[1])
    print("fused_experts weight layout:", layout)
    prepared = moekit.fused_experts(x, prepared_w1, w2, tw, ti.int(), weights_prepared=True)
    assert torch.equal(prepared, standard)
    out = torch.empty_like(x)
    assert moekit.fused_experts(x, prepared_w1, w2, tw, ti, weights_prepared=True, out=out) is out
    assert torch.equal(out, standard)


def test_fused_experts_in_a_cuda_graph(gpu: torch.device) -> None:
    x, w1, w2, tw, ti = fused_problem(gpu)
    moekit.prepare_fused_experts_weights(w1, w2, top_k=ti.shape[1])
    out = torch.empty_like(x)
    stream = torch.cuda.Stream(gpu)
    stream.wait_stream(torch.cuda.current_stream(gpu))
    with torch.cuda.stream(stream):
        for _ in range(2):
            moekit.fused_experts(x, w1, w2, tw, ti, weights_prepared=True, out=out)
    torch.cuda.current_stream(gpu).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moekit.fused_experts(x, w1, w2, tw, ti, weights_prepared=True, out=out)
    x.mul_(-0.5)
    graph.replay()
    eager = moekit.fused_experts(x, w1, w2, tw, ti, weights_prepared=True)
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


class Block(torch.nn.Module):
    """A module that calls both: the layer and the functional form."""

    def __init__(self, layer: moekit.MoELayer, w1: torch.Tensor, w2: torch.Tensor, k: int) -> None:
        super().__init__()
        self.layer, self.w1, self.w2, self.k = layer, w1, w2, k

    def forward(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        h = self.layer(x, logits) + x
        w, ids = torch.topk(torch.softmax(logits, dim=-1), self.k, dim=-1)
        return moekit.fused_experts(h, self.w1, self.w2, w / w.sum(-1, keepdim=True), ids,
                                    weights_prepared=True) * 0.5  # fmt: skip


def make_block(gpu: torch.device):
    layer = moekit.MoELayer("small", device=gpu, seed=4, max_num_tokens=256)
    _, w1, w2, _, _ = fused_problem(gpu)
    moekit.prepare_fused_experts_weights(w1, w2, top_k=4)
    return Block(layer, w1, w2, 4)


@needs_custom_op
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile(gpu: torch.device, mode: str) -> None:
    block = make_block(gpu)
    compiled = torch.compile(block, fullgraph=True, mode=mode)
    for M in (8, 8, 8, 32):  # reduce-overhead records a CUDA graph after warm-up calls
        x = torch.rand(M, 256, device=gpu).bfloat16()
        logits = torch.randn(M, 16, device=gpu)
        expected = block(x, logits)
        got = compiled(x, logits).clone()
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_overhead_table(gpu: torch.device) -> None:
    cases = [("tiny", 1), ("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 8), ("mixtral-8x7b", 1)]
    print("\n" + overhead_table(cases, f"cuda:{gpu.index}", iterations=500))


def test_checkpoint_layers_on_the_gpu(gpu: torch.device, tmp_path) -> None:  # noqa: ANN001
    moekit.write_fixture_checkpoint(tmp_path / "bf16", scheme="bf16", model="tiny")
    layer = moekit.MoELayer.from_checkpoint(tmp_path / "bf16", layer=0, device=gpu)
    x = torch.rand(9, layer.hidden_size).bfloat16()
    logits = layer.router_logits(x)  # on the CPU, through the checkpoint's gate
    out = layer(x.to(gpu), logits.to(gpu))
    weights, ids = layer.route(x.to(gpu), logits.to(gpu))
    w13, w2, _, _ = experts_of(layer, gpu)
    assert rel_l2(out, reference_experts(x.to(gpu), w13, w2, weights, ids)) <= layer.tolerance
    # A quantized scheme either runs or says which backends could not and why.
    moekit.write_fixture_checkpoint(tmp_path / "fp8", scheme="fp8_block128", model="tiny")
    try:
        fp8 = moekit.MoELayer.from_checkpoint(tmp_path / "fp8", layer=0, device=gpu)
    except moekit.UnsupportedError as e:
        print("fp8_block128 on the GPU:", str(e).splitlines()[0])
    else:
        assert fp8(x.to(gpu), logits.to(gpu)).shape == x.shape
