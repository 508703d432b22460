"""The per-call overhead of the Python binding: µs per call through Python against the C++ layer's
own time for the same layer and tensors (MoELayer.benchmark times forward_into from C++)."""

from __future__ import annotations

import os
import time
from typing import Callable, List, Tuple

import torch

import moekit


def time_calls(fn: Callable[[], object], iterations: int, device: torch.device, rounds: int = 3) -> Tuple[float, float]:
    """(host µs per call until the last call returned, wall µs per call until the work is done),
    the best of `rounds` rounds."""
    for _ in range(3):
        fn()
    best = (float("inf"), float("inf"))
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iterations):
            fn()
        t1 = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        best = min(best, ((t1 - t0) * 1e6 / iterations, (t2 - t0) * 1e6 / iterations))
    return best


def overhead_rows(layer: moekit.MoELayer, M: int, iterations: int) -> List[Tuple[str, float, float]]:
    """(what, host µs/call, wall µs/call) for one layer and M tokens."""
    device = layer.device
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(M, layer.hidden_size, generator=g) * 2 - 1).to(layer.dtype).to(device)
    logits = torch.randn(M, layer.num_experts, generator=g).to(device)
    out = torch.empty_like(x)
    rows = [("C++ MoELayer::forward_into", *min(layer.benchmark(x, logits, iterations) for _ in range(3)))]
    rows.append(("python layer.forward_into(out, x, logits)", *time_calls(lambda: layer.forward_into(out, x, logits), iterations, device)))
    rows.append(("python layer(x, logits)", *time_calls(lambda: layer(x, logits), iterations, device)))
    op = torch.ops.moekit.layer_forward
    rows.append(("torch.ops.moekit.layer_forward", *time_calls(lambda: op(x, logits, layer.layer_id), iterations, device)))
    # The functional form on weights of the same shape, with the layer's routing.
    E, H, I, k = layer.num_experts, layer.hidden_size, layer.intermediate_size, layer.top_k
    w1 = torch.empty(E, 2 * I, H, dtype=layer.dtype, device=device).uniform_(-0.05, 0.05)
    w2 = torch.empty(E, H, I, dtype=layer.dtype, device=device).uniform_(-0.05, 0.05)
    moekit.prepare_fused_experts_weights(w1, w2, top_k=k)
    topk_weights, topk_ids = layer.route(x, logits)
    rows.append(("python moekit.fused_experts (same shape)", *time_calls(
        lambda: moekit.fused_experts(x, w1, w2, topk_weights, topk_ids, weights_prepared=True, out=out),
        iterations, device)))  # fmt: skip
    del w1, w2
    if device.type == "cuda":
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                layer.forward_into(out, x, logits)
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer.forward_into(out, x, logits)
        rows.append(("CUDA graph replay of layer.forward_into", *time_calls(graph.replay, iterations, device)))
    return rows


def overhead_table(cases: List[Tuple[str, int]], device: str, iterations: int = 200) -> str:
    """A text table for (preset, M) cases on `device`; also appended to $MOEKIT_BENCH_LOG."""
    lines = [
        f"moekit {moekit.__version__} python binding overhead, torch {torch.__version__}, "
        f"device {device}" + (f" ({torch.cuda.get_device_name()})" if device != "cpu" else ""),
        f"{'model':<16} {'M':>4}  {'call':<44} {'host us/call':>12} {'wall us/call':>12} {'+host us':>9}",
    ]
    for preset, M in cases:
        layer = moekit.MoELayer(preset, device=device, seed=0, max_num_tokens=max(M, 1))
        rows = overhead_rows(layer, M, iterations)
        base = rows[0][1]
        for what, host, wall in rows:
            lines.append(f"{preset:<16} {M:>4}  {what:<44} {host:>12.1f} {wall:>12.1f} {host - base:>+9.1f}")
        layer.close()
    text = "\n".join(lines)
    log = os.environ.get("MOEKIT_BENCH_LOG")
    if log:
        with open(log, "a") as f:
            f.write(text + "\n\n")
    return text
