"""A plain-torch reference of torchao 0.18's AdamW8bit / AdamW4bit step (its
default path, torch.compile on the CPU), bit for bit: test_lowbit.py checks
it against torchao itself, and uses it where torchao cannot run: amsgrad with
quantized states (torchao 0.18's subclasses have no aten.maximum, so its
step fails there; this reference applies torch.maximum to the f32 values,
as torchao's single_param_adam writes it).

No torchao import.  Every arithmetic op below is a separate eager torch op on float32
tensors, so every intermediate is rounded to fp32 exactly where torchao's inductor-generated
C++ kernel rounds (inductor CPU builds with -ffp-contract=off, so no FMA contraction).

NOTE: do NOT use torch.lerp here: eager CPU lerp is computed with an FMA
(vec::fmadd(weight, end - start, start)), while the compiled torchao step decomposes lerp into
start + (end - start) * w (two roundings).  torchao's default (compiled) path is the latter.
"""
import math

import torch

F32 = torch.float32

# ----------------------------------------------------------------------------- qmaps

def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """Same construction as torchao.optim.quant_utils.create_dynamic_map (bitsandbytes, no padding).

    linspace/means are computed in fp32 torch, the decade factor is a python float
    (10**k, k<0 -> python float, 10**0 -> int 1) multiplied into the fp32 tensor (fp32 mul with
    the scalar rounded to fp32), values collected as python floats, then sorted.
    """
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        n = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = torch.linspace(0.1, 1, n)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if additional_items > 0:  # never taken for the (7,8) and (3,4) maps
        boundaries = torch.linspace(0.1, 1, additional_items + 1)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data.sort()
    return data


def qmap(bits: int, signed: bool) -> torch.Tensor:
    if bits == 8:
        vals = create_dynamic_map(signed, 7, 8)
    elif bits == 4:
        vals = create_dynamic_map(True, 3, 4) if signed else torch.linspace(0, 1, 17)[1:].tolist()
    else:
        raise ValueError(bits)
    return torch.tensor(vals, dtype=F32)


# ----------------------------------------------------------------------------- quantization

def block_absmax_scale(x: torch.Tensor, block_size: int):
    """x: fp32, numel % block_size == 0 (row-major flattening). Returns (x/scale, scale)."""
    xb = x.reshape(-1, block_size)
    scale = xb.abs().amax(-1).clamp_min(1e-12)          # fp32; clip(1e-12) -> fl32(1e-12)
    return (xb / scale[:, None]).reshape(-1), scale     # true IEEE division, not reciprocal


def quantize_codes(y: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Branchless binary search + round-half-up, exactly as torchao (int64 codes)."""
    n = q.numel()
    bits = n.bit_length() - 1
    codes = torch.zeros(y.shape, dtype=torch.int64)
    step = n // 2
    while step >= 1:
        codes = codes + torch.where(y >= q[codes + step], step, 0)
        step //= 2
    # codes == max{i : q[i] <= y}, or 0 if y < q[1] (q[0] is never compared)
    up = (codes + 1).clamp(max=n - 1)
    lo_v, up_v = q[codes], q[up]
    resid = y - lo_v                                      # fp32 rounding
    half = (up_v - lo_v) * 0.5                            # fp32 (exact)
    codes = torch.where(resid >= half, up, codes)         # tie -> up
    return codes


def dequantize(codes: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """codes: int tensor, flattened in row-major order. returns flat fp32."""
    return (q[codes.long()].reshape(scale.numel(), -1) * scale[:, None]).reshape(-1)


def pack4(codes: torch.Tensor) -> torch.Tensor:
    c = codes.reshape(-1).to(torch.uint8)
    return (c[0::2] << 4) | c[1::2]                      # even element -> high nibble


def unpack4(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed >> 4, packed & 0b1111], dim=-1).reshape(-1)


# ----------------------------------------------------------------------------- state

class QState:
    """Quantized state: codes (8-bit: uint8, param shape; 4-bit: packed uint8, numel//2),
    scale (fp32, numel//block_size), qmap (fp32)."""

    def __init__(self, numel, shape, bits, signed, block_size):
        self.bits, self.signed, self.block_size, self.shape = bits, signed, block_size, shape
        self.qmap = qmap(bits, signed)
        self.codes = (torch.zeros(shape, dtype=torch.uint8) if bits == 8
                      else torch.zeros(numel // 2, dtype=torch.uint8))
        self.scale = torch.zeros(numel // block_size, dtype=F32)

    def dequant(self):
        c = self.codes.reshape(-1) if self.bits == 8 else unpack4(self.codes)
        return dequantize(c, self.qmap, self.scale)

    def store(self, x_flat_f32):
        y, scale = block_absmax_scale(x_flat_f32, self.block_size)
        c = quantize_codes(y, self.qmap)
        if self.bits == 8:
            self.codes.copy_(c.to(torch.uint8).reshape(self.shape))
        else:
            self.codes.copy_(pack4(c))
        self.scale.copy_(scale)


def default_block_size(bits):
    return 256 if bits == 8 else 128


def init_state(p: torch.Tensor, bits: int, block_size=None, amsgrad=False):
    bs = block_size or default_block_size(bits)
    n = p.numel()
    quant = n >= 4096 and n % bs == 0
    st = {"step": torch.tensor(0.0)}
    names = (("exp_avg", True), ("exp_avg_sq", False)) + ((("max_exp_avg_sq", False),) if amsgrad else ())
    for name, signed in names:
        st[name] = QState(n, tuple(p.shape), bits, signed, bs) if quant else torch.zeros_like(p)
    return st


# ----------------------------------------------------------------------------- step

def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 sqrt (what inductor's _mm512_sqrt_ps / std::sqrt give).

    Eager torch.sqrt on CPU goes through MKL VML (vsSqrt, HA mode) and is NOT correctly
    rounded on this machine (~17% of random inputs off by 1 ulp), so it cannot be used.
    Candidate from a float64 sqrt, then an exact fix-up: the fp32 midpoints between
    neighbours have <= 25 significant bits, so their squares are exact in float64.
    """
    x = x.float()
    y = x.double().sqrt().float()
    lo = torch.nextafter(y, torch.zeros_like(y))
    hi = torch.nextafter(y, torch.full_like(y, float("inf")))
    xd, yd = x.double(), y.double()
    m_lo = (yd + lo.double()) * 0.5
    m_hi = (yd + hi.double()) * 0.5
    y = torch.where(xd < m_lo * m_lo, lo, torch.where(xd > m_hi * m_hi, hi, y))
    # keep special values (0, -0, inf, nan, negatives) from the plain sqrt
    special = (x <= 0) | ~torch.isfinite(x)
    return torch.where(special, x.sqrt(), y)


def _lerp_compiled(start, end, w: float):
    """Inductor's aten.lerp.Scalar decomposition, unfused: two fp32 roundings."""
    diff = end - start
    if w >= 0.5 or w <= -0.5:
        return end + diff * torch.tensor(-(1.0 - w), dtype=F32)
    return start + diff * torch.tensor(w, dtype=F32)


@torch.no_grad()
def ref_adamw_lowbit_step(p, g, state, lr, betas, eps, weight_decay, bits=8, block_size=None, amsgrad=False):
    """One AdamW step on (p, g) in place, updating `state` (from init_state). lr: python float or
    fp32 0-dim tensor (torchao keeps group['lr'] as an fp32 tensor)."""
    if not state:
        state.update(init_state(p, bits, block_size, amsgrad))
    beta1, beta2 = betas
    state["step"] += 1
    step = state["step"]                                   # fp32 0-dim
    lr_t = lr if isinstance(lr, torch.Tensor) else torch.tensor(lr, dtype=F32)
    lr_t = lr_t.to(F32)

    p32 = p.detach().reshape(-1).float()
    g32 = g.reshape(-1).float()

    # decoupled weight decay: p - ((lr*wd) * p)
    p32 = p32 - (lr_t * torch.tensor(weight_decay, dtype=F32)) * p32

    m_st, v_st = state["exp_avg"], state["exp_avg_sq"]
    m0 = m_st.dequant() if isinstance(m_st, QState) else m_st.reshape(-1).float()
    v0 = v_st.dequant() if isinstance(v_st, QState) else v_st.reshape(-1).float()

    m1 = _lerp_compiled(m0, g32, 1 - beta1)
    v1 = _lerp_compiled(v0, g32 * g32, 1 - beta2)

    # bias corrections: fp32, powf(fl32(beta), step_f32)
    bc1 = 1.0 - torch.pow(torch.tensor(beta1, dtype=F32), step)
    bc2 = 1.0 - torch.pow(torch.tensor(beta2, dtype=F32), step)

    for st, val in ((m_st, m1), (v_st, v1)):
        if isinstance(st, QState):
            st.store(val)
        else:
            st.copy_(val.reshape(st.shape))                 # RNE cast to p.dtype

    if amsgrad:  # torch.maximum(max_exp_avg_sq.float(), exp_avg_sq_f32), stored
        x_st = state["max_exp_avg_sq"]
        x0 = x_st.dequant() if isinstance(x_st, QState) else x_st.reshape(-1).float()
        v1 = torch.maximum(x0, v1)
        if isinstance(x_st, QState):
            x_st.store(v1)
        else:
            x_st.copy_(v1.reshape(x_st.shape))
    denom = sqrt_rn(v1) / sqrt_rn(bc2) + torch.tensor(eps, dtype=F32)
    p32 = p32 - (lr_t * (m1 / bc1)) / denom
    p.detach().copy_(p32.reshape(p.shape))                  # RNE to bf16 if p is bf16
    return p


def state_tensors(state):
    """bytes-comparable view: dict name -> list of tensors."""
    out = {}
    for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        if k not in state:
            continue
        s = state[k]
        out[k] = [s.codes, s.scale] if isinstance(s, QState) else [s]
    return out
