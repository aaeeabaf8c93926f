/* bfloat16 <-> float32 for the native CPU kernels (fused_ops.c, q8_matmul.c).
 * bf16 is the top half of a float32: widening is a shift; narrowing rounds to
 * nearest even and keeps NaNs quiet NaNs (with their sign), as PyTorch does.
 * Written so GCC vectorises loops over them. */
#ifndef KERNELS_BF16_H
#define KERNELS_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u; /* keep NaNs quiet NaNs */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* IEEE half -> float32, exactly (the block scales of GGUF's Q5_0, read as the file holds them). */
#if defined(__F16C__)
#include <immintrin.h>
static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    float f;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24 */
        f = (float)mant * (1.0f / 16777216.0f);
        memcpy(&u, &f, 4);
        u |= sign;
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}
#endif

#endif
