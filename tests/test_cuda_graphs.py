"""CUDA graphs: every operator is capture-safe (the current stream, the caching allocator, no host
synchronization, ATen's cuBLAS handle), so a converted model's training step can be captured with
torch.cuda.graph and replayed, and torch.compile(mode="reduce-overhead") runs it as a graph.
Needs a GPU; skipped without one."""
import copy

import pytest
import torch
from torch import nn

import torch_convbp

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch_convbp.CUDA_KERNELS), reason="needs a CUDA device and the CUDA kernels"
)

FORMATS = [torch.contiguous_format, torch.channels_last]


def small_model(memory_format):
    """Every route a CUDA call takes on small layers: a dense 3x3 (padded, stride 1: the input
    gradient as a convolution), a strided grouped layer (col2im), a depthwise layer, a 1x1 layer,
    with biases and a batch norm; converted to torch_convbp."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=4), nn.ReLU(),
        nn.Conv2d(16, 16, 5, padding=2, groups=16), nn.ReLU(),
        nn.Conv2d(16, 8, 1),
    )
    return torch_convbp.convert(model).cuda().to(memory_format=memory_format)


def inputs(memory_format, seed):
    torch.manual_seed(seed)
    return torch.randn(4, 3, 16, 16, device="cuda").contiguous(memory_format=memory_format)


def training_step(model, optimizer, x):
    optimizer.zero_grad(set_to_none=False)
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    return loss


def parameters_of(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("memory_format", FORMATS, ids=str)
def test_a_captured_training_step_replays_as_the_eager_one(memory_format):
    """Captured once, replayed on new data: the loss, and the parameters after the optimizer's
    step, are those of the same steps run eagerly."""
    eager = small_model(memory_format)
    captured = copy.deepcopy(eager)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    captured_opt = torch.optim.SGD(captured.parameters(), lr=0.1, momentum=0.9)
    static_x = inputs(memory_format, seed=1)

    # Warm-up on a side stream, as torch.cuda.graph asks; the eager model takes the same steps.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            training_step(captured, captured_opt, static_x)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        training_step(eager, eager_opt, static_x)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = training_step(captured, captured_opt, static_x)
    # Capturing runs nothing: the parameters are still those after the warm-up.
    for seed in (2, 3, 4):
        x = inputs(memory_format, seed)
        static_x.copy_(x)
        graph.replay()
        loss = training_step(eager, eager_opt, x)
        torch.cuda.synchronize()
        torch.testing.assert_close(static_loss, loss, rtol=1e-5, atol=1e-6)
        for replayed, stepped in zip(captured.parameters(), eager.parameters()):
            torch.testing.assert_close(replayed, stepped, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("memory_format", FORMATS, ids=str)
def test_replays_are_bitwise_repeatable(memory_format):
    """The same inputs and parameters replayed twice give the same bits (no atomics anywhere in
    our kernels, captured or not)."""
    model = small_model(memory_format)
    static_x = inputs(memory_format, seed=1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model.zero_grad(set_to_none=False)
            model(static_x).square().mean().backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_y = model(static_x)
        static_y.square().mean().backward()
    results = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        results.append([static_y.clone()] + [p.grad.clone() for p in model.parameters()])
    for first, second in zip(*results):
        assert torch.equal(first, second)


@pytest.mark.parametrize("memory_format", FORMATS, ids=str)
def test_compile_reduce_overhead_runs_as_a_graph_and_matches_eager(memory_format):
    """torch.compile(mode="reduce-overhead") takes our operators into its CUDA graphs (no skip)
    and computes what eager does, forward and backward."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = small_model(memory_format)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, mode="reduce-overhead")
    for seed in range(4):  # the first calls record; later ones replay
        x = inputs(memory_format, seed)
        for model in (eager, compiled_model):
            model.zero_grad(set_to_none=True)
        y_eager = eager(x)
        y_eager.square().mean().backward()
        y = compiled(x)
        y.square().mean().backward()
        torch.testing.assert_close(y, y_eager, rtol=1e-5, atol=1e-6)
        for p, q in zip(compiled_model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
