"""One FFN training step on this rank's share of a fixed batch; rank 0 saves the updated parameters.

Run under hpctrain's local launcher (gloo) with 1 or 2 ranks: argv = output path, world batch size.
"""

from __future__ import annotations

import os
import sys

import torch

from hpctrain.ffn.model import ConvStack3D
from hpctrain.ffn.training.loss import clip_gradients_, fov_loss
from hpctrain.runtime.comm.backends import make_communicator
from hpctrain.runtime.reducer import Reducer, broadcast_model


def main() -> None:
    out, batch = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    comm = make_communicator("gloo" if world > 1 else "none", 60.0)
    torch.manual_seed(0)
    model = ConvStack3D(depth=2, features=8, fov=(9, 9, 9))
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(batch, 2, 9, 9, 9, generator=generator)
    labels = (torch.rand(batch, 1, 9, 9, 9, generator=generator) > 0.5).float() * 0.9 + 0.05
    share = batch // comm.size
    mine = slice(comm.rank * share, (comm.rank + 1) * share)
    broadcast_model(model, comm)
    reducer = Reducer(model, comm, bucket_mb=0.01)  # the mean
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reducer.zero_grad()
    fov_loss(model(inputs[mine]), labels[mine]).backward()
    reducer.finish()
    clip_gradients_(model, 0.7)
    optimizer.step()
    if comm.rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)
    comm.close()


if __name__ == "__main__":
    main()
