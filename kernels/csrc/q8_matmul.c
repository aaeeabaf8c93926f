/* out[r, n] = sum_k x[r, k] * w[n, k] for a weight held as 8-bit blocks:
 * w[n, k] = codes[n, k] * scales[n, k / 32] (GGUF's Q8_0, kept as the file
 * has it). For the few rows of a decode step (the LM head of a tied-embedding
 * model at batch 1-8), where a dense bf16 GEMV streams twice the bytes.
 *
 * x is float32 or bfloat16 ([rows, K], row stride sx elements), widened to
 * float32 once; codes int8 [N, K] contiguous; scales float32 [N, K / 32];
 * out float32 [rows, N] (row stride so). Each block's 32 codes are widened
 * to float32, scaled by the block's scale (exact: an int8 times an fp16
 * scale fits float32's mantissa), and multiplied into float32 accumulators,
 * one per input row, reduced once per output. So the result is the float32
 * product with the file's exact weights, up to summation order.
 *
 * Rows are processed MAX_ROWS at a time; output channels are split across
 * OpenMP threads. Returns 0, or 1 when K is not a multiple of 32, 2 when out
 * of memory.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define Q8_BLOCK 32
#define MAX_ROWS 8
/* Prefetch the codes this many output rows ahead: the hardware prefetcher alone keeps the LM head's
 * stream of codes well below memory bandwidth; 16 rows ahead (9 KB for K = 576) was the best distance
 * measured. */
#define PREFETCH_ROWS 16

/* Outputs [n0, n1) for rows [0, rows) of xf (float32, contiguous [rows, K]). */
static void q8_rows(const float *xf, const int8_t *codes, const float *scales, float *out, int64_t rows,
                    int64_t n0, int64_t n1, int64_t n_total, int64_t k, int64_t so) {
    int64_t blocks = k / Q8_BLOCK;
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *q = codes + n * k;
        const float *d = scales + n * blocks;
        /* the codes PREFETCH_ROWS rows ahead (the last rows of the matrix have none) */
        const int8_t *ahead = n + PREFETCH_ROWS < n_total ? q + PREFETCH_ROWS * k : q;
#if defined(__AVX512F__)
        __m512 acc[MAX_ROWS];
        for (int64_t r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < blocks; b++) {
            __builtin_prefetch(ahead + b * Q8_BLOCK);
            __m512 scale = _mm512_set1_ps(d[b]);
            __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i *)(q + b * Q8_BLOCK)))), scale);
            __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i *)(q + b * Q8_BLOCK + 16)))), scale);
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = xf + r * k + b * Q8_BLOCK;
                acc[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r]);
                acc[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc[r]);
            }
        }
        for (int64_t r = 0; r < rows; r++) out[r * so + n] = _mm512_reduce_add_ps(acc[r]);
#elif defined(__AVX2__) && defined(__FMA__)
        __m256 acc[MAX_ROWS];
        for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < blocks; b++) {
            __builtin_prefetch(ahead + b * Q8_BLOCK);
            __m256 scale = _mm256_set1_ps(d[b]);
            __m256 w[4];
            for (int j = 0; j < 4; j++)
                w[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(q + b * Q8_BLOCK + 8 * j)))), scale);
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = xf + r * k + b * Q8_BLOCK;
                for (int j = 0; j < 4; j++) acc[r] = _mm256_fmadd_ps(w[j], _mm256_loadu_ps(xr + 8 * j), acc[r]);
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            out[r * so + n] = _mm_cvtss_f32(s);
        }
#else
        float acc[MAX_ROWS][16];
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < 16; j++) acc[r][j] = 0.0f;
        for (int64_t b = 0; b < blocks; b++) {
            __builtin_prefetch(ahead + b * Q8_BLOCK);
            float w[Q8_BLOCK];
            for (int j = 0; j < Q8_BLOCK; j++) w[j] = (float)q[b * Q8_BLOCK + j] * d[b];
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = xf + r * k + b * Q8_BLOCK;
                for (int j = 0; j < 16; j++) acc[r][j] += w[j] * xr[j] + w[j + 16] * xr[j + 16];
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            float total = 0.0f;
            for (int j = 0; j < 16; j++) total += acc[r][j];
            out[r * so + n] = total;
        }
#endif
    }
}

/* Which loops were compiled in: 2 AVX-512, 1 AVX2 + FMA, 0 portable (tests, diagnostics). */
int q8_matmul_isa(void) {
#if defined(__AVX512F__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

int q8_matmul(const void *x, const int8_t *codes, const float *scales, float *out, int64_t rows, int64_t n,
              int64_t k, int64_t sx, int64_t so, int dtype, int num_threads) {
    if (k % Q8_BLOCK) return 1;
    if (rows <= 0 || n <= 0) return 0;
    float *xf = malloc((size_t)(rows < MAX_ROWS ? rows : MAX_ROWS) * (size_t)k * sizeof(float));
    if (!xf) return 2;
    for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
        int64_t count = rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS;
        for (int64_t r = 0; r < count; r++) {
            if (dtype) {
                const uint16_t *src = (const uint16_t *)x + (r0 + r) * sx;
                for (int64_t i = 0; i < k; i++) xf[r * k + i] = bf16_to_f32(src[i]);
            } else {
                memcpy(xf + r * k, (const float *)x + (r0 + r) * sx, (size_t)k * sizeof(float));
            }
        }
        /* chunks of 64 outputs: a chunk's codes (64 x K bytes) stream while x stays in L1 */
        int64_t chunks = (n + 63) / 64;
        int threads = n * k >= (1 << 18) ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            int64_t lo = c * 64, hi = lo + 64 < n ? lo + 64 : n;
            q8_rows(xf, codes, scales, out + r0 * so, count, lo, hi, n, k, so);
        }
    }
    free(xf);
    return 0;
}
