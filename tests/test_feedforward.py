"""The one feed-forward block shared by the Transformer (ReLU) and ViT (GELU)."""

import pytest
import torch
import torch.nn.functional as F

from attnconv.layers.feedforward import FeedForward


@pytest.mark.parametrize("activation,act", [("relu", F.relu), ("gelu", F.gelu)])
def test_equation(activation, act):
    torch.manual_seed(0)
    ff = FeedForward(6, 10, 0.5, activation=activation, out_dropout=True).eval()
    x = torch.randn(2, 3, 6)
    want = F.linear(act(F.linear(x, ff.fc1.weight, ff.fc1.bias)), ff.fc2.weight, ff.fc2.bias)
    torch.testing.assert_close(ff(x), want)


def test_out_dropout_only_when_asked():
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    for out_dropout in (False, True):
        ff = FeedForward(8, 8, 0.5, out_dropout=out_dropout).train()
        ff.fc1.weight.data.fill_(1.0)  # every hidden unit active: a zero output needs out dropout
        zeros = (ff(x.abs() + 1) == 0).float().mean().item()
        assert (zeros > 0.2) == out_dropout


def test_bad_activation():
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(4, 8, activation="tanh")
