"""Data-parallel training: two processes (gloo, CPU) training a converted model with
DistributedDataParallel, each on half of every batch, end with the parameters one process gets
from the whole batches. With NCCL on GPUs the code is the same."""

import gc

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import torch_convbp

STEPS, BATCH = 4, 8


def make_model():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.ReLU(),
        nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(4, 2, 1), nn.Flatten(), nn.Linear(2 * 8 * 8, 3),
    ).double()
    return torch_convbp.convert(model)


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 3, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (BATCH,), generator=g))
            for _ in range(STEPS)]


def train(model, data, rank=0, world=1):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    share = BATCH // world
    for x, target in data:
        x, target = x[rank * share:(rank + 1) * share], target[rank * share:(rank + 1) * share]
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), target).backward()  # a mean: DDP averages the ranks'
        optimizer.step()
    return model


def worker(rank, world, store_path, static_graph, results_path):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        model = nn.parallel.DistributedDataParallel(make_model(), static_graph=static_graph)
        train(model, batches(), rank, world)
        if rank == 0:
            torch.save([p.detach() for p in model.module.parameters()], results_path)
        # DDP's reducer holds the process group, inside reference cycles. Freed only at exit, the
        # group's gloo threads were torn down during interpreter finalization, and torch 2.14
        # aborted there now and then ("terminate called without an active exception"). So the
        # model goes first, and both ranks reach the end before the group is destroyed.
        del model
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("static_graph", [False, True], ids=["dynamic-graph", "static-graph"])
def test_two_processes_train_like_one(tmp_path, static_graph):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    results = tmp_path / "params.pt"
    mp.spawn(worker, args=(2, str(tmp_path / "store"), static_graph, str(results)), nprocs=2, join=True)
    parallel = torch.load(results)
    single = list(train(make_model(), batches()).parameters())
    assert len(parallel) == len(single)
    for a, e in zip(parallel, single):
        torch.testing.assert_close(a, e.detach(), rtol=1e-10, atol=1e-12)
    assert any(not torch.equal(a, e) for a, e in zip(parallel, list(make_model().parameters())))  # it trained
