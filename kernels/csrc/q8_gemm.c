/* The int8-block matmul of q8_matmul.c for many rows, with its very bits (the AVX2 build's loop).
 *
 * q8_matmul widens and scales a weight row's codes again for every 4 input rows, and streams the whole
 * weight once per 8 rows: at 64 rows (the LM head of a 64-sequence decode step in batch-invariant mode) it
 * is ~3x slower than the dense GEMM. Here a chunk of output channels is dequantised once into a float32
 * panel (code * scale, the same single rounding), and then every pair of input rows runs against every
 * pair of channels of it (groups of 6 rows, so their x stays in L1). Each output keeps q8_rows' arithmetic exactly: two 8-lane accumulators, acc0 +=
 * w[16c .. 16c + 7] * x[..], acc1 += w[16c + 8 .. 16c + 15] * x[..] by FMA for c = 0, 1, ... in order, then
 * (acc0 + acc1), its two halves added, then the movehl and movehdup steps, and one rounding to the output's
 * dtype. So a row's result is the same through either kernel, alone or beside any rows
 * (kernels/q8_matmul_cpu.py switches between them by row count).
 *
 * Only the AVX2 build (no AVX-512) has this loop: the AVX-512 build of q8_rows sums in other lanes; there
 * q8_gemm answers 3 and callers keep q8_matmul. Returns 0; 1 for a block other than 16/32 or a K it does not
 * divide; 2 when out of memory.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define Q8G_BUILT 1
#endif

#define Q8G_CHUNK 48 /* output channels dequantised per panel */
#define Q8G_ROWS 2   /* input rows per tile */
#define Q8G_OUTS 2   /* output channels per tile: 2 x 2 x 2 accumulators, 4 x vectors and 2 w vectors in registers */
#define Q8G_GROUP 6  /* input rows whose x stays in L1 while a pair of channels runs over them */

#ifdef Q8G_BUILT
static inline void q8g_put(void *out, int64_t at, __m256 acc0, __m256 acc1, int out_bf16) {
    __m256 a = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float v = _mm_cvtss_f32(s);
    if (out_bf16)
        ((uint16_t *)out)[at] = f32_to_bf16(v);
    else
        ((float *)out)[at] = v;
}

/* rows (1..2) rows of xf against outs (1..2) channels of the panel p ([outs][K]) -> out[r * so + n]. */
static inline __attribute__((always_inline)) void q8g_tile(const float *xf, const float *p, void *out, int64_t so,
                                                           int64_t row0, int64_t n, int64_t k, const int rows,
                                                           const int outs, int out_bf16) {
    __m256 a0[Q8G_ROWS][Q8G_OUTS], a1[Q8G_ROWS][Q8G_OUTS];
#pragma GCC unroll 2
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 2
        for (int o = 0; o < outs; o++) a0[r][o] = a1[r][o] = _mm256_setzero_ps();
    for (int64_t at = 0; at < k; at += 16) {
        __m256 x0[Q8G_ROWS], x1[Q8G_ROWS];
#pragma GCC unroll 2
        for (int r = 0; r < rows; r++) {
            x0[r] = _mm256_loadu_ps(xf + r * k + at);
            x1[r] = _mm256_loadu_ps(xf + r * k + at + 8);
        }
#pragma GCC unroll 2
        for (int o = 0; o < outs; o++) {
            __m256 w0 = _mm256_loadu_ps(p + o * k + at), w1 = _mm256_loadu_ps(p + o * k + at + 8);
#pragma GCC unroll 2
            for (int r = 0; r < rows; r++) {
                a0[r][o] = _mm256_fmadd_ps(w0, x0[r], a0[r][o]);
                a1[r][o] = _mm256_fmadd_ps(w1, x1[r], a1[r][o]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 2
        for (int o = 0; o < outs; o++) q8g_put(out, (row0 + r) * so + n + o, a0[r][o], a1[r][o], out_bf16);
}

#define Q8G_TILE(R, O) q8g_tile(xf + m * k, p + o * k, out, so, m, n0 + o, k, R, O, ob)

static void q8g_chunk(const float *xf, const int8_t *codes, const float *scales, float *p, void *out, int64_t rows,
                      int64_t n0, int64_t n1, int64_t k, int64_t so, int64_t block, int ob) {
    const int64_t blocks = k / block, outs_total = n1 - n0;
    for (int64_t o = 0; o < outs_total; o++) { /* the panel: code * scale, as q8_rows' _mm256_mul_ps */
        const int8_t *q = codes + (n0 + o) * k;
        const float *d = scales + (n0 + o) * blocks;
        for (int64_t at = 0; at < k; at += 8) {
            __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + at))));
            _mm256_storeu_ps(p + o * k + at, _mm256_mul_ps(w, _mm256_set1_ps(d[at / block])));
        }
    }
    for (int64_t g = 0; g < rows; g += Q8G_GROUP) {
        const int64_t g1 = g + Q8G_GROUP < rows ? g + Q8G_GROUP : rows;
        for (int64_t o = 0; o < outs_total; o += Q8G_OUTS) {
            const int two_outs = outs_total - o >= 2;
            for (int64_t m = g; m < g1; m += Q8G_ROWS) {
                const int two_rows = g1 - m >= 2;
                if (two_rows && two_outs) Q8G_TILE(2, 2);
                else if (two_rows) Q8G_TILE(2, 1);
                else if (two_outs) Q8G_TILE(1, 2);
                else Q8G_TILE(1, 1);
            }
        }
    }
}
#endif

int q8_gemm(const void *x, const int8_t *codes, const float *scales, void *out, int64_t rows, int64_t n, int64_t k,
            int64_t sx, int64_t so, int dtype, int out_dtype, int64_t block, int num_threads) {
#ifdef Q8G_BUILT
    if ((block != 16 && block != 32) || k % block || k % 16) return 1;
    if (rows <= 0 || n <= 0) return 0;
    float *xf = malloc((size_t)rows * (size_t)k * sizeof(float));
    if (!xf) return 2;
    for (int64_t r = 0; r < rows; r++) {
        if (dtype) {
            const uint16_t *src = (const uint16_t *)x + r * sx;
            for (int64_t i = 0; i < k; i++) xf[r * k + i] = bf16_to_f32(src[i]);
        } else {
            memcpy(xf + r * k, (const float *)x + r * sx, (size_t)k * sizeof(float));
        }
    }
    const int64_t chunks = (n + Q8G_CHUNK - 1) / Q8G_CHUNK;
    int threads = num_threads < 1 ? 1 : num_threads, failed = 0;
    if (threads > chunks) threads = (int)chunks;
#pragma omp parallel num_threads(threads)
    {
        float *p = malloc((size_t)Q8G_CHUNK * (size_t)k * sizeof(float));
        if (!p) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            if (!p) continue;
            int64_t lo = c * Q8G_CHUNK, hi = lo + Q8G_CHUNK < n ? lo + Q8G_CHUNK : n;
            q8g_chunk(xf, codes, scales, p, out, rows, lo, hi, k, so, block, out_dtype);
        }
        free(p);
    }
    free(xf);
    return failed ? 2 : 0;
#else
    (void)x, (void)codes, (void)scales, (void)out, (void)rows, (void)n, (void)k, (void)sx, (void)so, (void)dtype,
        (void)out_dtype, (void)block, (void)num_threads;
    return 3;
#endif
}
