/* out[r, n] = sum_k x[r, k] * w[n, k] with ONE reduction order per output,
 * whatever the number of rows: the batch-invariant matmul of the CPU engine.
 *
 * A library GEMM picks its kernel, blocking and thread split from the shape
 * (MKL's float32 GEMM takes other paths at 1-9 rows; the engine switches
 * between a packed int4 GEMV and a dense GEMM at 8-16 rows), so a row's
 * result depends on how many other rows share the call. Here every output is
 * computed by one thread the same way: x's row widened to float32, the K axis
 * walked in blocks of 32 from k = 0, each block's products added into the
 * row's own vector accumulators (lanes fixed by k mod 32), the accumulators
 * then summed in a fixed tree, the tail (K mod 32) added last, in order. The
 * rows are taken MAX_ROWS at a time only to reuse each weight row from
 * cache; a row's arithmetic is the same in any tile, at any tile position,
 * with any thread count. Which instruction set runs is fixed at build time
 * (-march=native), so results are fixed per build (fixed_matmul_isa()).
 *
 * x: float32 or bfloat16 [rows, K] (row stride sx); w: float32 or bfloat16
 * [N, K] contiguous; out: float32 or bfloat16 [rows, N] (row stride so),
 * rounded once. Output channels are split across OpenMP threads in chunks of
 * 64. Returns 0, or 2 when out of memory.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define FM_BLOCK 32
#define FM_MAX_ROWS 8
#define FM_CHUNK 64

/* The 32 weights of block b of row n as float32, in dst[0..31]. */
static inline void weight_block(float *dst, const void *w, int wdtype, int64_t n, int64_t k, int64_t b) {
    if (wdtype) {
        const uint16_t *src = (const uint16_t *)w + n * k + b * FM_BLOCK;
        for (int j = 0; j < FM_BLOCK; j++) dst[j] = bf16_to_f32(src[j]);
    } else {
        memcpy(dst, (const float *)w + n * k + b * FM_BLOCK, FM_BLOCK * sizeof(float));
    }
}

static inline float weight_at(const void *w, int wdtype, int64_t n, int64_t k, int64_t i) {
    return wdtype ? bf16_to_f32(((const uint16_t *)w)[n * k + i]) : ((const float *)w)[n * k + i];
}

/* Outputs [n0, n1) of `rows` rows of xf (float32, contiguous [rows, K]) into res[r * (n1 - n0) + (n - n0)]. */
static void fm_rows(const float *xf, const void *w, int wdtype, float *res, int64_t rows, int64_t n0, int64_t n1,
                    int64_t k) {
    const int64_t blocks = k / FM_BLOCK, tail = k - blocks * FM_BLOCK;
    for (int64_t n = n0; n < n1; n++) {
#if defined(__AVX512F__)
        __m512 acc0[FM_MAX_ROWS], acc1[FM_MAX_ROWS];
        for (int64_t r = 0; r < rows; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < blocks; b++) {
            __m512 w0, w1;
            if (wdtype) {
                const uint16_t *src = (const uint16_t *)w + n * k + b * FM_BLOCK;
                w0 = _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src)), 16));
                w1 = _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + 16))), 16));
            } else {
                const float *src = (const float *)w + n * k + b * FM_BLOCK;
                w0 = _mm512_loadu_ps(src);
                w1 = _mm512_loadu_ps(src + 16);
            }
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = xf + r * k + b * FM_BLOCK;
                acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc0[r]);
                acc1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc1[r]);
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            /* fixed tree: the two accumulators, then 16 lanes -> 8 -> 4 -> 2 -> 1 */
            __m512 s16 = _mm512_add_ps(acc0[r], acc1[r]);
            __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(s16),
                                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1)));
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
            __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
            res[r * (n1 - n0) + (n - n0)] = _mm_cvtss_f32(s1);
        }
#elif defined(__AVX2__) && defined(__FMA__)
        __m256 acc[FM_MAX_ROWS][4];
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_ps();
        for (int64_t b = 0; b < blocks; b++) {
            __m256 wv[4];
            if (wdtype) {
                const uint16_t *src = (const uint16_t *)w + n * k + b * FM_BLOCK;
                for (int j = 0; j < 4; j++)
                    wv[j] = _mm256_castsi256_ps(_mm256_slli_epi32(
                        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 8 * j))), 16));
            } else {
                const float *src = (const float *)w + n * k + b * FM_BLOCK;
                for (int j = 0; j < 4; j++) wv[j] = _mm256_loadu_ps(src + 8 * j);
            }
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = xf + r * k + b * FM_BLOCK;
                for (int j = 0; j < 4; j++) acc[r][j] = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(xr + 8 * j), acc[r][j]);
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            __m256 s8 = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
            __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
            res[r * (n1 - n0) + (n - n0)] = _mm_cvtss_f32(s1);
        }
#else
        float acc[FM_MAX_ROWS][FM_BLOCK];
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < FM_BLOCK; j++) acc[r][j] = 0.0f;
        for (int64_t b = 0; b < blocks; b++) {
            float wb[FM_BLOCK];
            weight_block(wb, w, wdtype, n, k, b);
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = xf + r * k + b * FM_BLOCK;
                for (int j = 0; j < FM_BLOCK; j++) acc[r][j] += wb[j] * xr[j];
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            for (int width = FM_BLOCK / 2; width >= 1; width /= 2)
                for (int j = 0; j < width; j++) acc[r][j] += acc[r][j + width];
            res[r * (n1 - n0) + (n - n0)] = acc[r][0];
        }
#endif
        for (int64_t r = 0; r < rows; r++) {
            float t = res[r * (n1 - n0) + (n - n0)];
            for (int64_t i = blocks * FM_BLOCK; i < blocks * FM_BLOCK + tail; i++)
                t += weight_at(w, wdtype, n, k, i) * xf[r * k + i];
            res[r * (n1 - n0) + (n - n0)] = t;
        }
    }
}

/* Which loops were compiled in: 2 AVX-512, 1 AVX2 + FMA, 0 portable (the fingerprint, tests). */
int fixed_matmul_isa(void) {
#if defined(__AVX512F__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

int fixed_matmul(const void *x, const void *w, void *out, int64_t rows, int64_t n, int64_t k, int64_t sx,
                 int64_t so, int xdtype, int wdtype, int odtype, int num_threads) {
    if (rows <= 0 || n <= 0) return 0;
    int64_t tile_rows = rows < FM_MAX_ROWS ? rows : FM_MAX_ROWS;
    float *xf = malloc((size_t)tile_rows * (size_t)(k > 0 ? k : 1) * sizeof(float));
    if (!xf) return 2;
    int64_t chunks = (n + FM_CHUNK - 1) / FM_CHUNK;
    int threads = n * k * (rows < FM_MAX_ROWS ? rows : FM_MAX_ROWS) >= (1 << 16) ? num_threads : 1;
    if (threads < 1) threads = 1;
    for (int64_t r0 = 0; r0 < rows; r0 += FM_MAX_ROWS) {
        int64_t count = rows - r0 < FM_MAX_ROWS ? rows - r0 : FM_MAX_ROWS;
        for (int64_t r = 0; r < count; r++) {
            if (xdtype) {
                const uint16_t *src = (const uint16_t *)x + (r0 + r) * sx;
                for (int64_t i = 0; i < k; i++) xf[r * k + i] = bf16_to_f32(src[i]);
            } else {
                memcpy(xf + r * k, (const float *)x + (r0 + r) * sx, (size_t)k * sizeof(float));
            }
        }
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            int64_t lo = c * FM_CHUNK, hi = lo + FM_CHUNK < n ? lo + FM_CHUNK : n;
            float res[FM_MAX_ROWS * FM_CHUNK];
            fm_rows(xf, w, wdtype, res, count, lo, hi, k);
            for (int64_t r = 0; r < count; r++) {
                const float *src = res + r * (hi - lo);
                if (odtype) {
                    uint16_t *dst = (uint16_t *)out + (r0 + r) * so + lo;
                    for (int64_t i = 0; i < hi - lo; i++) dst[i] = f32_to_bf16(src[i]);
                } else {
                    memcpy((float *)out + (r0 + r) * so + lo, src, (size_t)(hi - lo) * sizeof(float));
                }
            }
        }
    }
    free(xf);
    return 0;
}
