"""Rotary position embedding, neox / HF-Llama "rotate_half" style.

cos_sin_cache[p] = cat(cos(p * inv_freq), sin(p * inv_freq)), float32,
[max_pos, head_dim]; the rotation covers the full head_dim.
"""

from __future__ import annotations

import torch

from kernels._triton import check, check_model_dtype, check_same_device, jit, kernel_for, next_pow2, tl


def build_cos_sin_cache(
    head_dim: int, max_pos: int, theta: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """[max_pos, head_dim] float32: the cos half, then the sin half."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    )
    t = torch.arange(max_pos, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    # Rounded exactly like HF's q * cos + rotate_half(q) * sin (no fused multiply-adds).
    out = torch.empty_like(xf)
    tmp = torch.mul(x2, sin)
    torch.mul(x1, cos, out=out[..., :half]).sub_(tmp)
    torch.mul(x1, sin, out=tmp)
    torch.mul(x2, cos, out=out[..., half:]).add_(tmp)
    return out.to(x.dtype)


def _joint_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """q and k as one [T, Hq + Hkv, D] view when k's heads follow q's in memory,
    as they do when both are column slices of one fused qkv projection."""
    if q.dtype != k.dtype or q.device != k.device or q.shape[0] != k.shape[0]:
        return None
    if q.stride() != k.stride() or q.stride(1) != q.shape[2] or q.stride(2) != 1:
        return None
    if k.data_ptr() != q.data_ptr() + q.shape[1] * q.stride(1) * q.element_size():
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], q.shape[2]), q.stride())


def rotary_embedding_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T], q [T, Hq, D], k [T, Hkv, D] -> rotated (q, k), float32 math.

    Returns new tensors (the inputs are not modified). When q and k are
    adjacent slices of one buffer they are rotated in a single pass and come
    back as views of one [T, Hq + Hkv, D] result.
    """
    half = q.shape[-1] // 2
    cs = cos_sin_cache.index_select(0, positions.long()).unsqueeze(1)  # [T, 1, D]
    cos, sin = cs[..., :half], cs[..., half:]
    joint = _joint_heads(q, k)
    if joint is not None:
        out = _rotate(joint, cos, sin)
        return out[:, : q.shape[1]], out[:, q.shape[1] :]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


@jit
def load_cos_sin(cache_ptr, pos, stride_cache, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Position ``pos``'s cos and sin halves from the cache, each [1, BLOCK_HALF] (zero past HALF)."""
    dims = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cache_ptr + pos * stride_cache + dims, mask=dims < HALF, other=0.0)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + dims, mask=dims < HALF, other=0.0)[None, :]
    return cos, sin


@jit
def rotate_heads(src_ptr, dst_ptr, stride_src_h, stride_dst_h, cos, sin,
                 NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rotate one token's NUM_HEADS heads at ``src_ptr`` into ``dst_ptr`` (float32 math, rotate_half layout)."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < NUM_HEADS) & (dims < HALF)
    src = src_ptr + heads * stride_src_h + dims
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + heads * stride_dst_h + dims
    tl.store(dst, (x1 * cos - x2 * sin).to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(dst_ptr.dtype.element_ty), mask=mask)


@jit
def _rotary_embedding_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr, q_out_ptr, k_out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_cache,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    # One program per token: rotate every query and key head of that token.
    t = tl.program_id(0).to(tl.int64)
    cos, sin = load_cos_sin(cache_ptr, tl.load(pos_ptr + t).to(tl.int64), stride_cache, HALF, BLOCK_HALF)
    rotate_heads(q_ptr + t * stride_qt, q_out_ptr + t * stride_qot, stride_qh, stride_qoh, cos, sin,
                 NUM_Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF)
    rotate_heads(k_ptr + t * stride_kt, k_out_ptr + t * stride_kot, stride_kh, stride_koh, cos, sin,
                 NUM_KV_HEADS, HALF, BLOCK_HK, BLOCK_HALF)


def check_rotary_inputs(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        cos_sin_cache: torch.Tensor) -> torch.device:
    """The Triton launchers' contract for rotating q [T, Hq, D] and k [T, Hkv, D]; -> their device."""
    device = check_same_device(positions, q, k, cos_sin_cache)
    check(q.dim() == 3 and k.dim() == 3, "q and k must be [T, H, D]")
    num_tokens, _, dim = q.shape
    check(k.shape[0] == num_tokens and k.shape[2] == dim, f"k {tuple(k.shape)} does not match q {tuple(q.shape)}")
    check(dim % 2 == 0, "head_dim must be even")
    check(positions.shape == (num_tokens,), "positions must be [T]")
    check(positions.dtype in (torch.int64, torch.int32), "positions must be an integer tensor")
    check(cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == dim, f"cos_sin_cache must be [max_pos, {dim}]")
    check(cos_sin_cache.dtype == torch.float32 and cos_sin_cache.stride(1) == 1, "cos_sin_cache must be contiguous float32")
    check(q.stride(2) == 1 and k.stride(2) == 1, "q/k head_dim must be contiguous")
    check_model_dtype("q", q)
    check(k.dtype == q.dtype, "q and k must share a dtype")
    return device


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher; same contract as ``rotary_embedding_ref`` (returns new tensors)."""
    device = check_rotary_inputs(positions, q, k, cos_sin_cache)
    num_tokens, hq, dim = q.shape
    q_out = torch.empty((num_tokens, hq, dim), dtype=q.dtype, device=device)
    k_out = torch.empty((num_tokens, k.shape[1], dim), dtype=k.dtype, device=device)
    if num_tokens:
        kernel_for(_rotary_embedding_kernel, device)[(num_tokens,)](
            positions, q, k, cos_sin_cache, q_out, k_out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            cos_sin_cache.stride(0),
            NUM_Q_HEADS=hq, NUM_KV_HEADS=k.shape[1], HALF=dim // 2,
            BLOCK_HQ=next_pow2(hq), BLOCK_HK=next_pow2(k.shape[1]), BLOCK_HALF=next_pow2(dim // 2),
        )
    return q_out, k_out
