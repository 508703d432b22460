"""moekit.MoELayer on the CPU: outputs against a plain-torch float64 reference, zero-copy, errors
carrying the library's messages, M = 0, explain, checkpoint layers, expert parallelism."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

import moekit
from conftest import layer_reference, reference_experts, rel_l2, softmax_topk

TINY = dict(E=8, k=2, H=64, I=96)  # the "tiny" preset


def tiny_weights(dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    E, H, I = TINY["E"], TINY["H"], TINY["I"]
    w13 = (torch.rand(E, 2 * I, H, generator=g) * 2 - 1) / H**0.5
    w2 = (torch.rand(E, H, I, generator=g) * 2 - 1) / I**0.5
    return w13.to(dtype), w2.to(dtype)


def inputs(M: int, dtype: torch.dtype, seed: int = 1, skewed: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(M, TINY["H"], generator=g) * 2 - 1).to(dtype)
    logits = torch.randn(M, TINY["E"], generator=g)
    if skewed:  # every token on experts 0 and 1
        logits[:, :2] += 20.0
    return x, logits


def test_import_and_version() -> None:
    assert moekit.__version__ == "0.1.0"
    assert pathlib.Path(moekit.library_path).is_file()
    assert moekit.REGISTRATION in ("custom_op", "library")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,skewed", [(1, False), (33, False), (33, True)])
def test_forward_matches_reference(dtype: torch.dtype, M: int, skewed: bool) -> None:
    w13, w2 = tiny_weights(dtype)
    ref_w13, ref_w2 = w13.clone(), w2.clone()
    layer = moekit.MoELayer.from_weights("tiny", w13, w2, device="cpu")
    x, logits = inputs(M, dtype, skewed=skewed)
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    layer.forward_into(out, x, logits)

    ref_weights, ref_ids = softmax_topk(logits, TINY["k"])
    weights, ids = layer.route(x, logits)
    assert torch.equal(ids.long().sort(dim=1).values, ref_ids.sort(dim=1).values)
    torch.testing.assert_close(weights.gather(1, ids.long().argsort(1)), ref_weights.gather(1, ref_ids.argsort(1)))
    ref = reference_experts(x, ref_w13, ref_w2, ref_weights, ref_ids)
    assert not out.isnan().any()
    assert rel_l2(out, ref) <= layer.tolerance, (rel_l2(out, ref), layer.tolerance)
    assert torch.equal(layer(x, logits), out)  # the module call does the same


def test_random_weights_layer_matches_its_experts() -> None:
    layer = moekit.MoELayer("small", seed=3, device="cpu")
    assert layer.dtype == torch.bfloat16 and layer.device == torch.device("cpu")
    assert (layer.num_experts, layer.top_k, layer.hidden_size, layer.intermediate_size) == (16, 4, 256, 384)
    g = torch.Generator().manual_seed(5)
    x = (torch.rand(17, 256, generator=g) * 2 - 1).bfloat16()
    logits = torch.randn(17, 16, generator=g)
    weights, ids = layer.route(x, logits)
    out = layer(x, logits)
    assert rel_l2(out, layer_reference(layer, x, weights, ids)) <= layer.tolerance


def test_router_weight_and_bias_from_weights() -> None:
    """The gate given with the experts (gpt-oss's has a bias): router_logits(x) is
    x @ router_weight^T + router_bias in float; a bias without its weight is refused by name."""
    w13, w2 = tiny_weights(torch.float32)
    g = torch.Generator().manual_seed(5)
    gate = torch.randn(TINY["E"], TINY["H"], generator=g)
    bias = torch.randn(TINY["E"], generator=g)
    layer = moekit.MoELayer.from_weights(
        "tiny", w13.clone(), w2.clone(), router_weight=gate, router_bias=bias, dtype=torch.float32, device="cpu"
    )
    assert layer.has_router_weight
    x, _ = inputs(13, torch.float32)
    expected = (x.double() @ gate.double().T + bias.double()).float()
    logits = layer.router_logits(x)
    assert torch.allclose(logits, expected, rtol=1e-5, atol=1e-5)
    unbiased = moekit.MoELayer.from_weights(
        "tiny", w13.clone(), w2.clone(), router_weight=gate, dtype=torch.float32, device="cpu"
    )
    assert torch.allclose(logits - unbiased.router_logits(x), bias.expand(13, -1), atol=1e-5)
    expect_error("router_bias", moekit.MoELayer.from_weights, "tiny", w13.clone(), w2.clone(),
                 router_bias=bias, dtype=torch.float32, device="cpu")  # fmt: skip
    expect_error("router_bias", moekit.MoELayer.from_weights, "tiny", w13.clone(), w2.clone(),
                 router_weight=gate, router_bias=bias[:5].clone(), dtype=torch.float32, device="cpu")  # fmt: skip


def test_zero_copy_in_and_out() -> None:
    w13, w2 = tiny_weights(torch.float32)
    layer = moekit.MoELayer.from_weights("tiny", w13, w2, dtype=torch.float32, device="cpu")
    x, logits = inputs(5, torch.float32)
    out = torch.empty_like(x)
    pointers = (x.data_ptr(), logits.data_ptr(), out.data_ptr())
    assert layer.forward_into(out, x, logits) is out
    assert (x.data_ptr(), logits.data_ptr(), out.data_ptr()) == pointers
    # The layer reads the caller's weights in place: scaling w2 scales the output.
    before = out.clone()
    w2.mul_(2.0)
    layer.forward_into(out, x, logits)
    torch.testing.assert_close(out, 2.0 * before, rtol=1e-6, atol=1e-6)


def test_forward_routed_equals_forward() -> None:
    layer = moekit.MoELayer("tiny", seed=1, device="cpu")
    x, logits = inputs(9, torch.bfloat16)
    weights, ids = layer.route(x, logits)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(layer.forward_routed(x, ids, weights), layer(x, logits))
    assert torch.equal(layer.forward_routed(x, ids.long(), weights), layer(x, logits))


def test_zero_tokens() -> None:
    layer = moekit.MoELayer("tiny", device="cpu")
    x = torch.empty(0, 64, dtype=torch.bfloat16)
    out = layer(x, torch.empty(0, 8))
    assert out.shape == (0, 64)


def test_expert_parallel_ranks_sum_to_the_whole_layer() -> None:
    w13, w2 = tiny_weights(torch.float32)
    x, logits = inputs(12, torch.float32)
    whole = moekit.MoELayer.from_weights("tiny", w13.clone(), w2.clone(), device="cpu")
    total = torch.zeros_like(x)
    for rank in range(2):
        part = slice(4 * rank, 4 * rank + 4)
        layer = moekit.MoELayer.from_weights(
            "tiny", w13[part].clone(), w2[part].clone(), device="cpu", ep_size=2, ep_rank=rank
        )
        assert (layer.num_local_experts, layer.first_local_expert) == (4, 4 * rank)
        total += layer(x, logits)
    torch.testing.assert_close(total, whole(x, logits), rtol=1e-5, atol=1e-6)


def expect_error(match: str, fn, *args, error=moekit.MoekitError, **kwargs):  # noqa: ANN001
    with pytest.raises(error, match=match) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_errors_carry_the_library_messages() -> None:
    layer = moekit.MoELayer("tiny", device="cpu", max_num_tokens=16)
    x, logits = inputs(4, torch.bfloat16)
    # Wrong hidden size: the message names the tensor, its shape and the requirement.
    msg = expect_error("hidden_states", layer, torch.zeros(4, 65, dtype=torch.bfloat16), logits)
    assert "[4, 65]" in msg and "64" in msg
    expect_error("dtype", layer, x.float(), logits)
    expect_error("router_logits", layer, x, logits[:, :7].contiguous())
    expect_error("max_num_tokens=16", layer, torch.zeros(17, 64, dtype=torch.bfloat16), torch.zeros(17, 8))
    expect_error("contiguous", layer, torch.zeros(64, 4, dtype=torch.bfloat16).T, logits)
    expect_error("known presets are .*tiny", moekit.MoELayer, "no-such-model")
    expect_error("unknown dtype", moekit.MoELayer, "tiny", dtype="int3", device="cpu")
    expect_error("cannot open /nonexistent/config.json", moekit.MoELayer, "/nonexistent/config.json")
    expect_error("w13", moekit.MoELayer.from_weights, "tiny", *tiny_weights(torch.float32), dtype="bf16", device="cpu")
    # A forced GPU backend on the CPU: UnsupportedError with the oracle's reason.
    msg = expect_error("sm90_grouped", moekit.MoELayer, "tiny", device="cpu", backend="sm90_grouped",
                       error=moekit.UnsupportedError)  # fmt: skip
    assert "cpu" in msg.lower()
    # After an error the layer still works.
    assert layer(x, logits).shape == x.shape


def test_closed_layer() -> None:
    layer = moekit.MoELayer("tiny", device="cpu")
    layer.close()
    with pytest.raises(moekit.MoekitError, match="closed"):
        layer.explain()


def test_explain_a_layer_and_a_deployment() -> None:
    layer = moekit.MoELayer("tiny", device="cpu")
    text = layer.explain()
    assert text.startswith("model        tiny: E=8 top_k=2 H=64 I=96")
    assert layer.plan in text and layer.backend in text and layer.backend
    assert layer.scheme == "unquantized (bf16)"
    assert layer.experts_name in layer.plan
    assert moekit.explain(layer) == text
    # A deployment without weights, on a GPU that is not here.
    h200 = moekit.explain("qwen3-30b-a3b", device="h200")
    assert "sm90_grouped" in h200 and "E=128" in h200
    if not moekit.built_with_cuda() or moekit.cuda_device_count() == 0:
        assert "not present" in h200
    ep = moekit.explain("deepseek-v3", device="h200", tp_size=8, enable_ep=True)
    assert "ep=8" in ep
    # DP + EP with the experts exchanging tokens through the GPUs' memory themselves.
    mk = moekit.explain("deepseek-v3", device="h200", dp_size=2, enable_ep=True, all2all="megakernel")
    assert "sm90_ep_peer    Sm90EpPeerExperts" in mk and "(deployment: megakernel)" in mk
    assert "kernel does not support parallel config" in mk or "not present" in mk
    fp8 = moekit.explain("deepseek-v3", quantization="fp8_block128", device="h200")
    assert "quark fp8_block128" in fp8 and "method" in fp8


def test_config_json(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        '{"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, '
        '"hidden_size": 64, "moe_intermediate_size": 32, "norm_topk_prob": true}'
    )
    layer = moekit.MoELayer(config, device="cpu", dtype=torch.float32)
    assert (layer.num_experts, layer.hidden_size, layer.intermediate_size) == (8, 64, 32)
    x, logits = inputs(3, torch.float32)
    weights, ids = layer.route(x, logits)
    assert rel_l2(layer(x, logits), layer_reference(layer, x, weights, ids)) <= layer.tolerance
    assert "E=8" in moekit.explain(str(config), device="cpu")


def test_checkpoint_layer_fp8(tmp_path: pathlib.Path) -> None:
    moekit.write_fixture_checkpoint(tmp_path, scheme="fp8_block128", model="tiny")
    layer = moekit.MoELayer.from_checkpoint(tmp_path, layer=0, device="cpu")
    assert layer.is_quantized and layer.has_router_weight
    assert "fp8" in layer.scheme.lower()
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(21, layer.hidden_size, generator=g) * 2 - 1).bfloat16()
    logits = layer.router_logits(x)
    assert logits.shape == (21, layer.num_experts) and logits.dtype == torch.float32
    out = layer(x, logits)
    ref_weights, ref_ids = softmax_topk(logits, layer.top_k)
    weights, ids = layer.route(x, logits)
    assert torch.equal(ids.long().sort(dim=1).values, ref_ids.sort(dim=1).values)
    # Plain torch over the dequantized experts (activations not quantized): the scheme's tolerance.
    assert rel_l2(out, layer_reference(layer, x, weights, ids)) <= layer.tolerance
    text = moekit.explain(str(tmp_path), device="cpu")
    assert "quark" in text and "method" in text


def test_checkpoint_gpt_oss_tensor_parallel(tmp_path: pathlib.Path) -> None:
    """gpt-oss's MXFP4 checkpoint (fused experts, router bias) as an engine runs it under tensor
    parallelism: each rank's layer holds its slice; the ranks' outputs sum to the whole layer."""
    moekit.write_fixture_checkpoint(tmp_path, scheme="hf_mxfp4", model="tiny-gpt-oss")
    whole = moekit.MoELayer.from_checkpoint(tmp_path, layer=1, device="cpu")
    assert whole.is_quantized and whole.top_k == 4
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(9, whole.hidden_size, generator=g) * 2 - 1).bfloat16()
    logits = whole.router_logits(x)
    ranks = [
        moekit.MoELayer.from_checkpoint(tmp_path, layer=1, device="cpu", tp_size=2, tp_rank=r)
        for r in range(2)
    ]
    assert all(r.intermediate_size == whole.intermediate_size // 2 for r in ranks)
    total = sum(r(x, logits).float() for r in ranks)
    assert rel_l2(total, whole(x, logits).float()) <= 2e-2


def test_checkpoint_errors(tmp_path: pathlib.Path) -> None:
    expect_error("needs a config.json", moekit.MoELayer.from_checkpoint, tmp_path, 0, device="cpu")
    moekit.write_fixture_checkpoint(tmp_path, scheme="bf16", model="tiny")
    os.remove(tmp_path / "model.safetensors")
    expect_error("no \\*.safetensors files", moekit.MoELayer.from_checkpoint, tmp_path, 0, device="cpu")
    if not moekit.built_with_cuda():
        expect_error("built without CUDA", moekit.MoELayer, "tiny", device="cuda")


def test_overhead_table_cpu() -> None:
    from overhead import overhead_table

    print("\n" + overhead_table([("tiny", 1)], "cpu", iterations=50))
