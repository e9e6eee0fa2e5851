"""One assertion the dropout tests share: two paths holding the same weights, each drawing its
dropout masks from one seed, give the same values and the same gradients of the input and of
every parameter."""

from __future__ import annotations

import torch


def assert_same_training_step(paths, x: torch.Tensor, seed: int) -> None:
    """``paths``: two (module, forward) pairs; ``x`` the input (made to require grad)."""
    x = x.requires_grad_()
    outs, grads = [], []
    for m, run in paths:
        torch.manual_seed(seed)
        y = run(x)
        params = [q for q in m.parameters() if q.requires_grad]
        grads.append(torch.autograd.grad((y * y.detach().cos()).sum(), [x, *params]))
        outs.append(y)
    torch.testing.assert_close(outs[0], outs[1])
    for ga, gr in zip(*grads):
        torch.testing.assert_close(ga, gr)
