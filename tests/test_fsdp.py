"""Fully sharded data parallel (FSDP2, fully_shard): two processes (gloo, CPU) train a converted
model, each layer sharded across them and each process on half of every batch, and end with the
parameters one process gets from the whole batches. With NCCL on GPUs the code is the same."""
import gc

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import torch_convbp
from test_ddp import BATCH, batches, make_model, train


def worker(rank, world, store_path, results_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model = make_model()
        for layer in model:
            if isinstance(layer, (torch_convbp.Conv2d, torch_convbp.ConvTranspose2d, nn.Linear)):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        train(model, batches(), rank, world)
        full = [p.full_tensor().detach() for p in model.parameters()]  # gathered from both ranks
        if rank == 0:
            torch.save(full, results_path)
        del model
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_processes_train_like_one(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    pytest.importorskip("torch.distributed.fsdp", reason="no FSDP2")
    assert BATCH % 2 == 0
    results = tmp_path / "params.pt"
    mp.spawn(worker, args=(2, str(tmp_path / "store"), str(results)), nprocs=2, join=True)
    sharded = torch.load(results)
    single = list(train(make_model(), batches()).parameters())
    assert len(sharded) == len(single)
    for a, e in zip(sharded, single):
        torch.testing.assert_close(a, e.detach(), rtol=1e-10, atol=1e-12)
    assert any(not torch.equal(a, e) for a, e in zip(sharded, list(make_model().parameters())))  # it trained
