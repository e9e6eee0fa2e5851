"""Small CNNs with the features of the depthwise-heavy model-zoo families (written here: no
timm/torchvision dependency), for the conversion benchmark and its tests. NCHW images -> logits.

- ``InvertedResidualNet``: MobileNetV2 / MNASNet / FBNet / EfficientNet(V2) / MixNet blocks:
  1x1 expand (optionally grouped), kxk depthwise with stride 1 or 2 (or a MixNet mixed-kernel
  depthwise: channels split over kernel sizes), squeeze-excitation, 1x1 project, BN,
  ReLU/ReLU6/SiLU; EfficientNetV2's fused blocks (one full kxk conv). Presets: ``mnasnet_like``,
  ``fbnet_like``, ``efficientnetv2_like``, ``mixnet_like``.
- ``XceptionNet``: Xception-41 style separable convs (depthwise 3x3 + pointwise 1x1), the
  stride-2 depthwise at the end of each entry block, 1x1 stride-2 shortcuts.
- ``RegNetYNet``: RegNetY blocks: 1x1, grouped 3x3 (group width 8..16, stride 2), SE, 1x1.
- ``GhostNet``: Ghost bottlenecks: a 1x1 primary conv and its cheap 3x3 depthwise "ghosts",
  stride-2 depthwise kxk, SE, depthwise + pointwise shortcuts.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn

ACTS = {"relu": nn.ReLU, "relu6": nn.ReLU6, "silu": nn.SiLU}


def conv_bn(cin, cout, k=1, stride=1, groups=1, act: str | None = "relu") -> nn.Sequential:
    """Conv (padding k // 2, no bias), BatchNorm, optional activation."""
    layers = [
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    return nn.Sequential(*layers, ACTS[act]()) if act else nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Global mean -> 1x1 reduce -> act -> 1x1 expand -> sigmoid gate of the channels."""

    def __init__(self, c: int, squeeze: int, act: str = "relu"):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)
        self.act = ACTS[act]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)  # (B, C, 1, 1)
        return x * torch.sigmoid(self.expand(self.act(self.reduce(s))))


class MixedDepthwise(nn.Module):
    """MixNet's mixed depthwise conv: channels split into len(kernels) parts (the first takes
    the remainder), part i a depthwise conv with kernels[i], outputs concatenated."""

    def __init__(self, c: int, kernels: tuple[int, ...], stride: int = 1):
        super().__init__()
        n = len(kernels)
        self.splits = [c // n + (c % n if i == 0 else 0) for i in range(n)]
        self.convs = nn.ModuleList(
            nn.Conv2d(s, s, k, stride, k // 2, groups=s, bias=False)
            for s, k in zip(self.splits, kernels)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, self.splits, dim=1)
        return torch.cat([conv(p) for conv, p in zip(self.convs, parts)], dim=1)


class MB(NamedTuple):
    """One stage of inverted-residual blocks: expansion, kernel (int, or a tuple: mixed
    depthwise), stride of its first block, output channels, repeats, SE ratio (of the block's
    input channels; 0 = none), fused (EfficientNetV2), groups of the 1x1 convs."""

    e: int
    k: int | tuple[int, ...]
    s: int
    c: int
    n: int = 1
    se: float = 0.0
    fused: bool = False
    g: int = 1


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, cfg: MB, stride: int, act: str):
        super().__init__()
        e, k = cin * cfg.e, cfg.k
        layers: list[nn.Module] = []
        if cfg.fused:  # one full kxk conv expands (EfficientNetV2 Fused-MBConv)
            layers.append(conv_bn(cin, e if cfg.e > 1 else cout, k, stride, act=act))
        else:
            if cfg.e > 1:
                layers.append(conv_bn(cin, e, 1, groups=cfg.g, act=act))
            if isinstance(k, tuple):
                layers += [MixedDepthwise(e, k, stride), nn.BatchNorm2d(e), ACTS[act]()]
            else:
                layers.append(conv_bn(e, e, k, stride, groups=e, act=act))
        if cfg.se:
            layers.append(SqueezeExcite(e, max(1, int(cin * cfg.se)), act))
        if not (cfg.fused and cfg.e == 1):
            layers.append(conv_bn(e, cout, 1, groups=cfg.g, act=None))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class InvertedResidualNet(nn.Module):
    """3x3 stride-2 stem, stages of inverted residuals, 1x1 head conv, mean pool, linear."""

    def __init__(
        self,
        stages: list[MB],
        stem: int = 32,
        head: int = 1280,
        act: str = "relu",
        classes: int = 10,
    ):
        super().__init__()
        self.stem = conv_bn(3, stem, 3, 2, act=act)
        blocks, c = [], stem
        for cfg in stages:
            for i in range(cfg.n):
                blocks.append(InvertedResidual(c, cfg.c, cfg, cfg.s if i == 0 else 1, act))
                c = cfg.c
        self.blocks = nn.Sequential(*blocks)
        self.head = conv_bn(c, head, 1, act=act)
        self.fc = nn.Linear(head, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.head(self.blocks(self.stem(x))).mean((2, 3)))


def mnasnet_like(width: float = 1.0) -> InvertedResidualNet:
    """MNASNet-1.0 (torchvision layout): depthwise 3x3/5x5, expansion 3/6, stride 2, ReLU."""
    w = lambda c: max(8, int(c * width))  # noqa: E731
    stages = [
        MB(1, 3, 1, w(16)),
        MB(3, 3, 2, w(24), 3),
        MB(3, 5, 2, w(40), 3),
        MB(6, 5, 2, w(80), 3),
        MB(6, 3, 1, w(96), 2),
        MB(6, 5, 2, w(192), 4),
        MB(6, 3, 1, w(320)),
    ]
    return InvertedResidualNet(stages, w(32), w(1280))


def fbnet_like(width: float = 1.0) -> InvertedResidualNet:
    """FBNet-C: k3/k5 depthwise, expansion 1/3/6, grouped (g=2) 1x1 convs in e1 blocks, ReLU."""
    w = lambda c: max(8, int(c * width))  # noqa: E731
    stages = [
        MB(1, 3, 1, w(16)),
        MB(6, 3, 2, w(24)),
        MB(1, 3, 1, w(24), 2, g=2),
        MB(6, 5, 2, w(32)),
        MB(3, 5, 1, w(32)),
        MB(6, 5, 1, w(32)),
        MB(6, 3, 1, w(32)),
        MB(6, 5, 2, w(64)),
        MB(3, 5, 1, w(64)),
        MB(6, 5, 1, w(64), 2),
        MB(6, 5, 1, w(112), 3),
        MB(3, 5, 1, w(112)),
        MB(6, 5, 2, w(184), 4),
        MB(6, 3, 1, w(352)),
    ]
    return InvertedResidualNet(stages, w(16), w(1984))


def efficientnetv2_like(width: float = 1.0) -> InvertedResidualNet:
    """EfficientNetV2-B0: fused 3x3 blocks early, then MBConv 3x3 with SE 0.25, SiLU."""
    w = lambda c: max(8, int(c * width))  # noqa: E731
    stages = [
        MB(1, 3, 1, w(16), fused=True),
        MB(4, 3, 2, w(32), 2, fused=True),
        MB(4, 3, 2, w(48), 2, fused=True),
        MB(4, 3, 2, w(96), 3, se=0.25),
        MB(6, 3, 1, w(112), 5, se=0.25),
        MB(6, 3, 2, w(192), 8, se=0.25),
    ]
    return InvertedResidualNet(stages, w(32), w(1280), act="silu")


def mixnet_like(width: float = 1.0) -> InvertedResidualNet:
    """MixNet-S: mixed depthwise kernels 3/5/7/9/11 split by channel, grouped 1x1, SE, SiLU."""
    w = lambda c: max(8, int(c * width))  # noqa: E731
    stages = [
        MB(1, 3, 1, w(16)),
        MB(6, 3, 2, w(24), g=2),
        MB(3, 3, 1, w(24), g=2),
        MB(6, (3, 5, 7), 2, w(40), se=0.5),
        MB(6, (3, 5), 1, w(40), 3, se=0.5, g=2),
        MB(6, (3, 5, 7), 2, w(80), se=0.25),
        MB(6, (3, 5), 1, w(80), 2, se=0.25, g=2),
        MB(6, (3, 5, 7), 1, w(120), se=0.5, g=2),
        MB(3, (3, 5, 7, 9), 1, w(120), 2, se=0.5, g=2),
        MB(6, (3, 5, 7, 9, 11), 2, w(200), se=0.5),
        MB(6, (3, 5, 7, 9), 1, w(200), 2, se=0.5, g=2),
    ]
    return InvertedResidualNet(stages, w(16), w(1536), act="silu")


def separable(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    """Xception's separable conv: depthwise 3x3 (stride), BN, pointwise 1x1, BN, ReLU."""
    return nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin, act=None), conv_bn(cin, cout, 1))


class XceptionBlock(nn.Module):
    """Three separable convs, the last depthwise strided; 1x1 (strided) shortcut when needed."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            separable(cin, cout), separable(cout, cout), separable(cout, cout, stride)
        )
        self.short = (
            conv_bn(cin, cout, 1, stride, act=None) if stride > 1 or cin != cout else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.short(x) + self.body(x)


class XceptionNet(nn.Module):
    """Xception-41 layout (aligned): stem 3x3 s2 + 3x3, entry blocks (stride 2), middle
    blocks, an exit block (stride 2) and two separable convs. Widths scaled by default."""

    def __init__(
        self,
        entry=(64, 128, 256),
        middle: int = 256,
        depth: int = 4,
        exit_=(384, 512),
        classes: int = 10,
    ):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 32, 3, 2), conv_bn(32, 64, 3))
        blocks, c = [], 64
        for w in (*entry, middle):
            blocks.append(XceptionBlock(c, w, 2 if w != middle else 1))
            c = w
        blocks += [XceptionBlock(middle, middle, 1) for _ in range(depth - 1)]
        blocks += [XceptionBlock(middle, exit_[0], 2), separable(exit_[0], exit_[1])]
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(exit_[1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class RegNetYBlock(nn.Module):
    """1x1, grouped 3x3 (stride), SE (0.25 of the input width), 1x1; projected shortcut."""

    def __init__(self, cin: int, cout: int, stride: int, group_width: int):
        super().__init__()
        self.body = nn.Sequential(
            conv_bn(cin, cout, 1),
            conv_bn(cout, cout, 3, stride, groups=cout // group_width),
            SqueezeExcite(cout, max(1, cin // 4)),
            conv_bn(cout, cout, 1, act=None),
        )
        self.short = (
            conv_bn(cin, cout, 1, stride, act=None) if stride > 1 or cin != cout else nn.Identity()
        )
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.short(x) + self.body(x))


class RegNetYNet(nn.Module):
    """RegNetY-400MF-like: stem 3x3 s2 32, four stages (first block stride 2), group width 8."""

    def __init__(
        self,
        widths=(48, 104, 208, 440),
        depths=(1, 3, 6, 6),
        group_width: int = 8,
        classes: int = 10,
    ):
        super().__init__()
        self.stem = conv_bn(3, 32, 3, 2)
        blocks, c = [], 32
        for w, d in zip(widths, depths):
            for i in range(d):
                blocks.append(RegNetYBlock(c, w, 2 if i == 0 else 1, group_width))
                c = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class GhostModule(nn.Module):
    """A 1x1 primary conv to ceil(cout/2) channels plus its cheap 3x3 depthwise copy."""

    def __init__(self, cin: int, cout: int, relu: bool = True):
        super().__init__()
        init = (cout + 1) // 2
        act = "relu" if relu else None
        self.cout = cout
        self.primary = conv_bn(cin, init, 1, act=act)
        self.cheap = conv_bn(init, init, 3, groups=init, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.primary(x)
        return torch.cat([y, self.cheap(y)], dim=1)[:, : self.cout]


class GhostBottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, cout: int, k: int, stride: int, se: float):
        super().__init__()
        layers: list[nn.Module] = [GhostModule(cin, mid)]
        if stride > 1:
            layers.append(conv_bn(mid, mid, k, stride, groups=mid, act=None))
        if se:
            layers.append(SqueezeExcite(mid, max(4, int(mid * se))))
        layers.append(GhostModule(mid, cout, relu=False))
        self.body = nn.Sequential(*layers)
        self.short = nn.Identity()
        if stride > 1 or cin != cout:
            self.short = nn.Sequential(
                conv_bn(cin, cin, k, stride, groups=cin, act=None), conv_bn(cin, cout, 1, act=None)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.short(x) + self.body(x)


GHOSTNET_CFG = [  # kernel, expanded, out, SE ratio, stride (GhostNet 1.0)
    (3, 16, 16, 0, 1),
    (3, 48, 24, 0, 2),
    (3, 72, 24, 0, 1),
    (5, 72, 40, 0.25, 2),
    (5, 120, 40, 0.25, 1),
    (3, 240, 80, 0, 2),
    (3, 200, 80, 0, 1),
    (3, 184, 80, 0, 1),
    (3, 184, 80, 0, 1),
    (3, 480, 112, 0.25, 1),
    (3, 672, 112, 0.25, 1),
    (5, 672, 160, 0.25, 2),
    (5, 960, 160, 0, 1),
    (5, 960, 160, 0.25, 1),
    (5, 960, 160, 0, 1),
    (5, 960, 160, 0.25, 1),
]


class GhostNet(nn.Module):
    """GhostNet 1.0 (width-scalable): stem 3x3 s2 16, Ghost bottlenecks, 1x1 head, linear."""

    def __init__(self, width: float = 1.0, classes: int = 10):
        super().__init__()
        w = lambda c: max(4, 4 * round(c * width / 4))  # noqa: E731
        self.stem = conv_bn(3, w(16), 3, 2)
        blocks, c = [], w(16)
        for k, mid, out, se, s in GHOSTNET_CFG:
            blocks.append(GhostBottleneck(c, w(mid), w(out), k, s, se))
            c = w(out)
        self.blocks = nn.Sequential(*blocks)
        self.head = conv_bn(c, w(960), 1)
        self.fc = nn.Linear(w(960), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.head(self.blocks(self.stem(x))).mean((2, 3)))


@torch.no_grad()
def calibrate_batchnorm(net: nn.Module, size: int = 64, seed: int = 0) -> nn.Module:
    """Running statistics of every BatchNorm from one train-mode pass over a seeded random
    batch, so that a randomly initialized deep network keeps its activations' scale in eval
    mode (else they vanish layer after layer and the logits are the same for every image).
    Returns ``net`` in eval mode."""
    bns = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average: this one batch
    x = torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(seed))
    net.train()(x)
    for bn in bns:
        bn.momentum = 0.1
    return net.eval()


def zoo_networks(quick: bool = False) -> dict[str, nn.Module]:
    """The benchmark's zoo-like networks by name (``quick``: tiny widths for smoke tests), in
    eval mode with calibrated BatchNorm statistics."""
    s = 0.25 if quick else 1.0
    if quick:
        xcep = XceptionNet((16, 16, 16), 16, 1, (16, 16))
        regnet = RegNetYNet((16, 16, 32, 32), (1, 1, 1, 1))
    else:
        xcep, regnet = XceptionNet(), RegNetYNet()
    nets = {
        "mnasnet_like": mnasnet_like(s),
        "fbnet_like": fbnet_like(s),
        "efficientnetv2_like": efficientnetv2_like(s),
        "mixnet_like": mixnet_like(s),
        "xception_like": xcep,
        "regnety_like": regnet,
        "ghostnet_like": GhostNet(s),
    }
    return {name: calibrate_batchnorm(net) for name, net in nets.items()}
