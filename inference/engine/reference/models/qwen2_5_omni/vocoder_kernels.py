"""The vocoder's anti-aliased Snake activation as one Triton kernel.

Qwen2.5-Omni's BigVGAN wraps every activation (109 of them at 7B shapes: 108 inside the
residual blocks, one before the last convolution) in anti-aliasing: upsample ×2 (replicate
padding, a depthwise transposed convolution with a 12-tap Kaiser-windowed sinc, a crop),
SnakeBeta at the doubled rate, then downsample ×2 (replicate padding, a depthwise 12-tap
low-pass convolution with stride 2). As modules that is five or more kernels per activation,
each reading and writing a tensor twice the signal's length; under load the transposed
convolution alone was cuDNN's largest kernel, and padding, depthwise convolutions and Snake's
elementwise kernels took about as much again (bench/results/JOURNAL.md).

All of it is linear filtering around one elementwise function, so each output sample can be
computed from the 11 input samples around it, in registers, in one pass:

- the ×2 upsampler is polyphase: the doubled signal's sample j = 2s + p is a 6-tap filter
  over x[s-3+p .. s+2+p] with the up filter's taps of parity 1-p (times the ratio, 2);
- output t of the downsampler reads the doubled signal at j = 2t + k - 5 for its taps
  k = 0..11, so tap k's upsampled value is a 6-tap sum over x[t + (k-k')/2] for the up taps
  k' of k's parity;
- replicate padding: the input's (before upsampling) is a clamp of x's index; the doubled
  signal's (before downsampling) replaces a j outside [0, 2T) by the first or last sample,
  which each row computes once.

Exactly the modules' arithmetic in float32, in another order of summation (the tests hold
it to the modules' output within 1e-5; bench/vocoder_kernel.py measures it at 7B shapes).
`TRITON_INTERPRET=1` runs it on the CPU (the tests do).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 256  # output samples per program
TAPS = 12    # the up and down filters' length (BigVGAN's default for ratio 2)
UP_PAD = TAPS // 2 - 1                                 # UpSample1d.pad (replicate, input)
UP_CROP = UP_PAD * 2 + (TAPS - 2) // 2                 # UpSample1d.pad_left (the crop)
DOWN_PAD = TAPS // 2 - 1                               # DownSample1d.pad_left (even taps)


@triton.jit
def _snake(u, alpha, inv_beta):
    s = tl.sin(u * alpha)
    return u + inv_beta * s * s


@triton.jit
def _upsampled(x_row, up_ptr, t, length, SHIFT: tl.constexpr, PARITY: tl.constexpr,
               TAPS: tl.constexpr):
    """The upsampler's output (before Snake) at one phase, for each t: the sum over the up
    taps kk of parity PARITY of f[kk] x[t + SHIFT - kk // 2] (the index clamped: the input's
    replicate padding), times the ratio."""
    u = tl.zeros(t.shape, tl.float32)
    for kk in tl.static_range(PARITY, TAPS, 2):
        index = tl.minimum(tl.maximum(t + SHIFT - kk // 2, 0), length - 1)
        u += tl.load(up_ptr + kk) * tl.load(x_row + index)
    return 2.0 * u


@triton.jit
def _anti_aliased_snake_kernel(x_ptr, out_ptr, alpha_ptr, inv_beta_ptr, up_ptr, down_ptr,
                               channels, length, TAPS: tl.constexpr, UP_PAD: tl.constexpr,
                               UP_CROP: tl.constexpr, DOWN_PAD: tl.constexpr,
                               BLOCK: tl.constexpr):
    row = tl.program_id(0)  # one (batch, channel) row of x
    channel = row % channels
    alpha = tl.load(alpha_ptr + channel)
    inv_beta = tl.load(inv_beta_ptr + channel)
    x_row = x_ptr + row.to(tl.int64) * length
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    zero = tl.zeros((BLOCK,), tl.int32)
    # the doubled signal's first and last samples (j = 0 and 2T-1): the downsampler's
    # replicate padding repeats them (computed as vectors of one value)
    first = _snake(_upsampled(x_row, up_ptr, zero, length, UP_CROP // 2 - UP_PAD,
                              UP_CROP % 2, TAPS), alpha, inv_beta)
    last = _snake(_upsampled(x_row, up_ptr, zero + length - 1, length, (UP_CROP + 1) // 2 - UP_PAD,
                             (UP_CROP + 1) % 2, TAPS), alpha, inv_beta)
    out = tl.zeros((BLOCK,), tl.float32)
    for k in tl.static_range(TAPS):
        # tap k reads the doubled signal at j = 2t + k - DOWN_PAD, which is the transposed
        # convolution's output j + UP_CROP: the up taps kk with (j + UP_CROP - kk) even, each
        # at the padded input's (j + UP_CROP - kk) / 2, i.e. x's index that minus UP_PAD
        j = 2 * t + (k - DOWN_PAD)
        value = _snake(_upsampled(x_row, up_ptr, t, length, (k - DOWN_PAD + UP_CROP) // 2 - UP_PAD,
                                  (k - DOWN_PAD + UP_CROP) % 2, TAPS), alpha, inv_beta)
        value = tl.where(j < 0, first, tl.where(j >= 2 * length, last, value))
        out += tl.load(down_ptr + k) * value
    tl.store(out_ptr + row.to(tl.int64) * length + t, out, mask=t < length)


class AntiAliasedSnake:
    """The fused form of every `Qwen2_5OmniAntiAliasedActivation1d` of one vocoder: call it
    with the module and its input instead of calling the module. Each module's constants
    (exp(alpha), 1 / (exp(beta) + eps), the two filters) are taken once, here."""

    def __init__(self, vocoder) -> None:
        self._constants: dict[int, tuple[torch.Tensor, ...]] = {}
        for module in vocoder.modules():
            if type(module).__name__.endswith("AntiAliasedActivation1d"):
                if not fusable(module):
                    raise ValueError("the fused activation takes ratio-2, 12-tap anti-aliasing only")
                snake = module.act
                self._constants[id(module)] = (
                    torch.exp(snake.alpha.detach().float()).contiguous(),
                    (1.0 / (torch.exp(snake.beta.detach().float()) + snake.no_div_by_zero)).contiguous(),
                    module.upsample.filter.detach().float().reshape(-1).contiguous(),
                    module.downsample.filter.detach().float().reshape(-1).contiguous())

    def __len__(self) -> int:
        """How many activations of the vocoder this computes."""
        return len(self._constants)

    def __call__(self, module, x: torch.Tensor) -> torch.Tensor:
        alpha, inv_beta, up, down = self._constants[id(module)]
        x = x.contiguous()
        batch, channels, length = x.shape
        out = torch.empty_like(x)
        grid = (batch * channels, triton.cdiv(length, BLOCK))
        _anti_aliased_snake_kernel[grid](x, out, alpha, inv_beta, up, down, channels, length,
                                         TAPS=TAPS, UP_PAD=UP_PAD, UP_CROP=UP_CROP,
                                         DOWN_PAD=DOWN_PAD, BLOCK=BLOCK)
        return out


def fusable(module) -> bool:
    """Whether `module` (an anti-aliased activation) is the shape the kernel computes."""
    up, down = module.upsample, module.downsample
    return (up.ratio == 2 and up.kernel_size == TAPS and down.stride == 2
            and down.kernel_size == TAPS and type(module.act).__name__.endswith("SnakeBeta"))
