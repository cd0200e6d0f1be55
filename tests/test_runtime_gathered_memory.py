"""What FSDP2 holds gathered, counted on a CPU (``runtime.measure.memory``: ``count_gathered``).

The runtime realises ``sharding: gradients`` (ZeRO-2, Rajbhandari et al. 2020 §5.2: P_os+g, the
parameters whole) as FSDP2 with ``reshard_after_forward=False``: every unit stays gathered from its
forward to its backward, so by the end of a forward a device holds the whole P beside its P/d shard.
Over torch's fake process group (its collectives do nothing, its buffers are real), in one process.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from runtime.measure.memory import SavedTensorMeter

D = 4
WHOLE_BYTES = 4 * (8 * 16 + 16 + 16 * 4 + 4)  # two fp32 Linears, 8 -> 16 -> 4, with biases: 848
FIRST_UNIT_BYTES = 4 * (8 * 16 + 16)  # 576


@pytest.fixture
def fake_data_mesh():
    """A 4-device data-parallel mesh in this one process (torch's fake process group)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=D, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (D,))
    finally:
        dist.destroy_process_group()


def _sharded_forward(mesh, *, reshard_after_forward: bool, count_gathered: bool = True):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    for layer in (model[0], model[2]):  # a unit per layer and the root, as runtime.model.sharding.shard_stage
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    shards = list(model.parameters())
    meter = SavedTensorMeter(shards, current=lambda: list(model.parameters()), count_gathered=count_gathered)
    meter.reset_peak()
    with meter.watching():
        loss = model(torch.randn(2, 8, requires_grad=True)).sum()
    return shards, meter, loss


def test_zero2_by_fsdp2_holds_the_whole_parameters_beside_its_shards_at_the_end_of_a_forward(fake_data_mesh):
    shards, meter, loss = _sharded_forward(fake_data_mesh, reshard_after_forward=False)
    assert sum(p.to_local().numel() * 4 for p in shards) == WHOLE_BYTES / D  # 212 at rest
    assert meter.gathered_bytes() == meter.peak_gathered_bytes == WHOLE_BYTES  # both units, kept for the backward
    # activations as without sharding: Linear 1's input 2·8, ReLU's output 2·16 (Linear 2's input too), fp32
    assert meter.peak_bytes == 4 * (2 * 8 + 2 * 16)
    # so at the peak the device holds P (1 + 1/d) of parameters: 848 + 212
    assert WHOLE_BYTES / D + meter.peak_gathered_bytes == WHOLE_BYTES * (1 + 1 / D)
    loss.backward()
    assert meter.gathered_bytes() == 0  # resharded after its backward: P/d between steps


def test_full_sharding_gathers_one_unit_at_a_time_and_an_uncounting_meter_none(fake_data_mesh):
    _, meter, _ = _sharded_forward(fake_data_mesh, reshard_after_forward=True)
    assert meter.peak_gathered_bytes == FIRST_UNIT_BYTES and meter.gathered_bytes() == 0  # a buffer while it runs
    _, meter, _ = _sharded_forward(fake_data_mesh, reshard_after_forward=False, count_gathered=False)
    assert meter.peak_gathered_bytes == meter.gathered_bytes() == 0
