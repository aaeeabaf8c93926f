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

#endif
