"""One rank of a real multi-process gloo job (spawned by test_multiprocess.py)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from commdebug import CommDebugMode


def run(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        torch.manual_seed(0)
        mesh = init_device_mesh("cpu", (world_size,))
        mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        mlp = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
        comm = CommDebugMode()
        with comm:
            for _ in range(2):
                mlp(torch.ones(4, 16, requires_grad=True)).sum().backward()
                opt.step()
                opt.zero_grad()
            # eager collectives and a point-to-point ring, as pipeline parallelism uses
            t = torch.full((8,), float(rank))
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
            recv = torch.empty(8)
            ops = [dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, recv, prv)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            dist.monitored_barrier()
        assert torch.equal(t, torch.full((8,), float(sum(range(world_size)))))
        comm.generate_json_dump(os.path.join(out_dir, f"rank{rank}.json"))
    finally:
        _teardown()


def _init(rank: int, world_size: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def _teardown() -> None:
    """Meet before tearing down: a rank that closes its connections while a peer is still
    finishing the last collective (a broadcast root returns before its receivers) makes gloo
    abort the peer."""
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()


MICROBATCHES, BATCH, WIDTH = 4, 8, 16


def _gpipe_step(rank: int, world_size: int):
    """One stage per rank of a pipelining schedule (GPipe) with its optimizer: a function that
    runs one training step."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(rank)
    stage_module = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())
    stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.1)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)

    def step() -> None:
        if rank == 0:
            schedule.step(x)
        elif rank == world_size - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()

    return step


def pipeline(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """One stage per rank of a pipelining schedule (GPipe), two training steps."""
    _init(rank, world_size, port)
    try:
        step = _gpipe_step(rank, world_size)
        comm = CommDebugMode()
        with comm:
            for _ in range(2):
                step()
        comm.generate_json_dump(os.path.join(out_dir, f"rank{rank}.json"))
    finally:
        _teardown()


def pipeline_full_and_light(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """The GPipe schedule: a warm-up step (shape inference), then two steps recorded fully and
    two lightly, each written to its own dump (``full<R>.json``, ``light<R>.json``); a forward
    hook checks that no dispatch mode is active in the light steps."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    _init(rank, world_size, port)
    try:
        step = _gpipe_step(rank, world_size)
        step()
        for capture in ("full", "light"):
            comm = CommDebugMode(light=capture == "light")
            modes: list = []
            hook = torch.nn.modules.module.register_module_forward_hook(
                lambda *_, modes=modes: modes.append(_get_current_dispatch_mode()))
            with comm:
                for _ in range(2):
                    step()
            hook.remove()
            assert modes and all(m is (None if capture == "light" else comm) for m in modes), (capture, modes)
            comm.generate_json_dump(os.path.join(out_dir, f"{capture}{rank}.json"))
        _ddp_full_and_light(rank, out_dir)
    finally:
        _teardown()


def _ddp_full_and_light(rank: int, out_dir: str) -> None:
    """DDP (small buckets: one all-reduce per layer's gradients, issued by the reducer in C++
    from the parameters' AccumulateGrad hooks), two steps recorded fully, then two lightly
    (``ddp_full<R>.json``, ``ddp_light<R>.json``)."""
    from torch.nn.parallel import DistributedDataParallel

    for capture in ("full", "light"):
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(WIDTH, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)), bucket_cap_mb=0.01)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        comm = CommDebugMode(light=capture == "light")
        with comm:
            for _ in range(2):
                model(torch.ones(BATCH, WIDTH)).sum().backward()
                opt.step()
                opt.zero_grad()
        comm.generate_json_dump(os.path.join(out_dir, f"ddp_{capture}{rank}.json"))


def profiled(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Tensor parallelism, FSDP2 and eager collectives under torch.profiler and CommDebugMode
    at once; writes our dump and the profiler's gloo:* event counts."""
    import json
    from collections import Counter

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.profiler import ProfilerActivity, profile

    _init(rank, world_size, port)
    try:
        torch.manual_seed(0)
        mesh = init_device_mesh("cpu", (world_size,))
        mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        mlp = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        sharded = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
        for layer in sharded:
            fully_shard(layer)
        fully_shard(sharded)
        comm = CommDebugMode()
        with profile(activities=[ProfilerActivity.CPU]) as prof, comm:
            for _ in range(2):
                mlp(torch.ones(4, 16)).sum().backward()
                sharded(torch.ones(4, 16)).sum().backward()
            t = torch.ones(8)
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            dist.all_gather_into_tensor(torch.empty(8 * world_size), t)
            dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * world_size))
            dist.all_to_all_single(torch.empty(8 * world_size), torch.ones(8 * world_size))
            dist.barrier()
            if rank == 0:
                dist.send(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
        comm.generate_json_dump(os.path.join(out_dir, f"rank{rank}.json"))
        gloo = Counter(e.name for e in prof.events() if e.name.startswith("gloo:"))
        with open(os.path.join(out_dir, f"profiler{rank}.json"), "w") as f:
            json.dump(gloo, f)
    finally:
        _teardown()


SLEEPY_RANK, SLEEP_S = 1, 0.4


def _every_op(rank: int, world_size: int) -> None:
    """One of each collective kind, and a send/recv ring."""
    t = torch.full((16,), float(rank))
    dist.all_reduce(t)
    dist.all_gather_into_tensor(torch.empty(16 * world_size), t)
    dist.reduce_scatter_tensor(torch.empty(16), torch.ones(16 * world_size))
    dist.all_to_all_single(torch.empty(16 * world_size), torch.ones(16 * world_size))
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    dist.gather(t, [torch.empty(16) for _ in range(world_size)] if rank == 0 else None, dst=0)
    dist.scatter(t, [torch.ones(16) for _ in range(world_size)] if rank == 0 else None, src=0)
    nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, torch.empty(16), prv)]):
        work.wait()
    dist.barrier()


def timing(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Timing, filters, the step window, verbose logging and configuration, for real."""
    import json
    import logging
    import time

    _init(rank, world_size, port)
    try:
        # 1. every op kind timed; one rank arrives late at the third all_reduce
        comm = CommDebugMode(timing="sync")
        with comm:
            _every_op(rank, world_size)
            for i in range(4):
                if i == 2 and rank == SLEEPY_RANK:
                    time.sleep(SLEEP_S)
                dist.all_reduce(torch.ones(1024))
        comm.generate_json_dump(os.path.join(out_dir, f"timed{rank}.json"))
        with open(os.path.join(out_dir, f"summary{rank}.txt"), "w") as f:
            f.write(comm.generate_summary_table(by="op,size"))

        # 2. only the collectives asked for
        only = CommDebugMode(ops=["all_reduce", "broadcast"])
        with only:
            _every_op(rank, world_size)
        only.generate_json_dump(os.path.join(out_dir, f"ops{rank}.json"))

        # 3. across nodes only, two ranks per node: pairs {0,1}, {2,3} stay inside a node
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        strided = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        node_group, other_group = pairs[rank // 2], strided[rank % 2]
        cross = CommDebugMode(crossnode_only=True, ranks_per_node=2)
        with cross:
            dist.all_reduce(torch.ones(4))  # world: crosses
            dist.all_reduce(torch.ones(4), group=node_group)  # inside one node
            dist.all_reduce(torch.ones(4), group=other_group)  # crosses
            peer = rank ^ 1  # same node
            far = (rank + 2) % world_size  # other node
            ops = [dist.P2POp(dist.isend, torch.ones(4), peer), dist.P2POp(dist.irecv, torch.empty(4), peer),
                   dist.P2POp(dist.isend, torch.ones(4), far), dist.P2POp(dist.irecv, torch.empty(4), far)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        cross.generate_json_dump(os.path.join(out_dir, f"cross{rank}.json"))

        # 4. a step window, verbose lines through logging, configured from a DeepSpeed file
        #    and environment variables together
        log_path = os.path.join(out_dir, f"verbose{rank}.log")
        handler = logging.FileHandler(log_path)
        logging.getLogger("commdebug").addHandler(handler)
        logging.getLogger("commdebug").setLevel(logging.INFO)
        config = os.path.join(out_dir, f"ds_config{rank}.json")
        with open(config, "w") as f:
            json.dump({"train_batch_size": 8, "comms_logger": {"enabled": True, "verbose": True, "prof_all": False,
                                                               "prof_ops": ["all_reduce", "all_gather_into_tensor"], "debug": True}}, f)
        os.environ["COMMDEBUG_START_STEP"] = "1"
        os.environ["COMMDEBUG_END_STEP"] = "3"
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        window = CommDebugMode.from_config(config)
        with window:
            for step in range(5):
                model(torch.ones(2, 4)).sum().backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                dist.all_gather_into_tensor(torch.empty(4 * world_size), torch.full((4,), float(step)))
                dist.broadcast(torch.ones(2), src=0)  # not in prof_ops
                opt.step()
                opt.zero_grad()
        del os.environ["COMMDEBUG_START_STEP"], os.environ["COMMDEBUG_END_STEP"]
        logging.getLogger("commdebug").removeHandler(handler)
        handler.close()
        window.generate_json_dump(os.path.join(out_dir, f"window{rank}.json"))
    finally:
        _teardown()
