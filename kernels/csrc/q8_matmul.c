/* out[r, n] = sum_k x[r, k] * w[n, k] for a weight held as 8-bit blocks:
 * w[n, k] = codes[n, k] * scales[n, k / block], block 32 (GGUF's Q8_0, and
 * Q5_0/Q4_0 shifted to signed codes) or 16 (Q6_K: a 6-bit code times its
 * sub-block's scale d * sc). For the few rows of a decode step (the LM head
 * of a tied-embedding model at batch 1-8, a layer at 1-4 rows), where a dense
 * bf16 GEMV streams twice the bytes.
 *
 * x is float32 or bfloat16 ([rows, K], row stride sx elements), widened to
 * float32 once; codes int8 [N, K] contiguous; scales float32 [N, K / block];
 * out float32 or bfloat16 [rows, N] (row stride so; bf16: the float32 sum
 * rounded once, to nearest even). Each block's codes are widened to float32,
 * scaled by the block's scale (exact: an int8 times an fp16 scale, or an
 * fp16 d times an int8 sc times an int8 code, fits float32's mantissa), and
 * multiplied into float32 accumulators (one per input row, two on AVX2),
 * reduced once per output; a row's order of sums never depends on the other
 * rows (the batch-invariant mode's LM head relies on it). So the result is the float32 product with the file's exact
 * weights, up to summation order.
 *
 * Rows are processed MAX_ROWS at a time; output channels are split across
 * OpenMP threads. Returns 0, or 1 when the block is not 16 or 32 or K not a
 * multiple of it, 2 when out of memory.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define CHUNK 16 /* codes widened per step: one AVX-512 vector, two AVX2 ones */
#define MAX_ROWS 8
#define AVX2_ROWS 4 /* rows per pass over a row of codes in the AVX2 loop (2 accumulators each) */
/* Prefetch the codes this many output rows ahead: the hardware prefetcher alone keeps the LM head's
 * stream of codes well below memory bandwidth; 16 rows ahead (9 KB for K = 576) was the best distance
 * measured. */
#define PREFETCH_ROWS 16

static inline void put(void *out, int64_t at, float value, int out_bf16) {
    if (out_bf16)
        ((uint16_t *)out)[at] = f32_to_bf16(value);
    else
        ((float *)out)[at] = value;
}

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* One row against outputs n .. n + OUTS - 1 at once (AVX2): each output's two chains of FMAs, sums and reduction
 * are those of q8_rows' loop, so the results are its bits; 2 * OUTS independent chains instead of two hide the FMA
 * latency that bounds a single row (the LM head at batch 1). */
#define OUTS 4
static void q8_one_row_outs(const float *xr, const int8_t *codes, const float *scales, void *out, int64_t n,
                            int64_t n_total, int64_t k, int64_t block, int out_bf16) {
    int64_t blocks = k / block, chunks_per_block = block / CHUNK;
    const int8_t *q = codes + n * k;
    const float *d = scales + n * blocks;
    const int8_t *ahead = n + OUTS - 1 + PREFETCH_ROWS < n_total ? q + PREFETCH_ROWS * k : q;
    __m256 acc0[OUTS], acc1[OUTS];
    for (int o = 0; o < OUTS; o++) acc0[o] = acc1[o] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        for (int64_t c = 0; c < chunks_per_block; c++) {
            int64_t at = b * block + c * CHUNK;
            if (!(at & 31))
                for (int o = 0; o < OUTS; o++) __builtin_prefetch(ahead + o * k + at);
            __m256 x0 = _mm256_loadu_ps(xr + at), x1 = _mm256_loadu_ps(xr + at + 8);
            for (int o = 0; o < OUTS; o++) {
                __m256 sc = _mm256_set1_ps(d[o * blocks + b]);
                __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(q + o * k + at)))), sc);
                __m256 w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(q + o * k + at + 8)))), sc);
                acc0[o] = _mm256_fmadd_ps(w0, x0, acc0[o]);
                acc1[o] = _mm256_fmadd_ps(w1, x1, acc1[o]);
            }
        }
    }
    for (int o = 0; o < OUTS; o++) {
        __m256 a = _mm256_add_ps(acc0[o], acc1[o]);
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        put(out, n + o, _mm_cvtss_f32(s), out_bf16);
    }
}
#endif

/* Outputs [n0, n1) for rows [0, rows) of xf (float32, contiguous [rows, K]). */
static void q8_rows(const float *xf, const int8_t *codes, const float *scales, void *out, int64_t rows,
                    int64_t n0, int64_t n1, int64_t n_total, int64_t k, int64_t so, int64_t block, int out_bf16) {
    int64_t blocks = k / block, chunks_per_block = block / CHUNK;
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
    if (rows == 1) /* OUTS outputs at a time, the rest of the range below */
        for (; n0 + OUTS <= n1; n0 += OUTS)
            q8_one_row_outs(xf, codes, scales, out, n0, n_total, k, block, out_bf16);
#endif
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *q = codes + n * k;
        const float *d = scales + n * blocks;
        /* the codes PREFETCH_ROWS rows ahead (the last rows of the matrix have none) */
        const int8_t *ahead = n + PREFETCH_ROWS < n_total ? q + PREFETCH_ROWS * k : q;
#if defined(__AVX512F__)
        __m512 acc[MAX_ROWS];
        for (int64_t r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < blocks; b++) {
            __m512 scale = _mm512_set1_ps(d[b]);
            for (int64_t c = 0; c < chunks_per_block; c++) {
                int64_t at = b * block + c * CHUNK;
                if (!(at & 31)) __builtin_prefetch(ahead + at);
                __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i *)(q + at)))), scale);
                for (int64_t r = 0; r < rows; r++)
                    acc[r] = _mm512_fmadd_ps(w, _mm512_loadu_ps(xf + r * k + at), acc[r]);
            }
        }
        for (int64_t r = 0; r < rows; r++) put(out, r * so + n, _mm512_reduce_add_ps(acc[r]), out_bf16);
#elif defined(__AVX2__) && defined(__FMA__)
        /* Two accumulators per row (one per 8 codes of a chunk): one chain of dependent FMAs per row let
         * the FMA latency, not the loads, set the pace at one row. Rows go AVX2_ROWS at a time so that the
         * accumulators stay in the 16 registers; a row's sums are the same whatever the row count. */
        for (int64_t g0 = 0; g0 < rows; g0 += AVX2_ROWS) {
            int64_t count = rows - g0 < AVX2_ROWS ? rows - g0 : AVX2_ROWS;
            __m256 acc0[AVX2_ROWS], acc1[AVX2_ROWS];
            for (int64_t r = 0; r < count; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
            for (int64_t b = 0; b < blocks; b++) {
                __m256 scale = _mm256_set1_ps(d[b]);
                for (int64_t c = 0; c < chunks_per_block; c++) {
                    int64_t at = b * block + c * CHUNK;
                    if (!(at & 31)) __builtin_prefetch(ahead + at);
                    __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                        _mm_loadl_epi64((const __m128i *)(q + at)))), scale);
                    __m256 w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                        _mm_loadl_epi64((const __m128i *)(q + at + 8)))), scale);
                    for (int64_t r = 0; r < count; r++) {
                        const float *xr = xf + (g0 + r) * k + at;
                        acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), acc0[r]);
                        acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), acc1[r]);
                    }
                }
            }
            for (int64_t r = 0; r < count; r++) {
                __m256 a = _mm256_add_ps(acc0[r], acc1[r]);
                __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
                s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                s = _mm_add_ss(s, _mm_movehdup_ps(s));
                put(out, (g0 + r) * so + n, _mm_cvtss_f32(s), out_bf16);
            }
        }
#else
        float acc[MAX_ROWS][CHUNK];
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < CHUNK; j++) acc[r][j] = 0.0f;
        for (int64_t b = 0; b < blocks; b++) {
            for (int64_t c = 0; c < chunks_per_block; c++) {
                int64_t at = b * block + c * CHUNK;
                if (!(at & 31)) __builtin_prefetch(ahead + at);
                float w[CHUNK];
                for (int j = 0; j < CHUNK; j++) w[j] = (float)q[at + j] * d[b];
                for (int64_t r = 0; r < rows; r++) {
                    const float *xr = xf + r * k + at;
                    for (int j = 0; j < CHUNK; j++) acc[r][j] += w[j] * xr[j];
                }
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            float total = 0.0f;
            for (int j = 0; j < CHUNK; j++) total += acc[r][j];
            put(out, r * so + n, total, out_bf16);
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

/* Q5_0 as the file holds it: per block of 32, an fp16 d, 32 high bits qh, 16 bytes of nibbles qs; value j
 * (0..15) is ((qs[j] & 15) | bit j of qh << 4) - 16, value j + 16 is ((qs[j] >> 4) | bit j + 16 << 4) - 16,
 * times d. 22 bytes a block against the int8 form's 36: the decode step's layers stream 40% fewer bytes.
 * The AVX-512 loop widens a block into the same two float32 vectors of code * d as q8_rows and multiplies
 * them in the same order, so it gives the int8 form's very bits. Other builds do not take it (q5_matmul
 * answers 3): callers keep the int8 form there. */
#define Q5_BYTES 22

static void q5_rows(const float *xf, const uint8_t *blocks, void *out, int64_t rows, int64_t n0, int64_t n1,
                    int64_t n_total, int64_t k, int64_t so, int out_bf16) {
#if defined(__AVX512F__)
    int64_t nb = k / 32, row_bytes = nb * Q5_BYTES;
    const __m512i low4 = _mm512_set1_epi32(15), sixteen = _mm512_set1_epi32(16);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *q = blocks + n * row_bytes;
        const uint8_t *ahead = n + PREFETCH_ROWS < n_total ? q + PREFETCH_ROWS * row_bytes : q;
        __m512 acc[MAX_ROWS];
        for (int64_t r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = q + b * Q5_BYTES;
            __builtin_prefetch(ahead + b * Q5_BYTES);
            uint16_t half;
            uint32_t qh;
            memcpy(&half, blk, 2);
            memcpy(&qh, blk + 2, 4);
            __m512 scale = _mm512_set1_ps(f16_to_f32(half));
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 6)));
            __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_srli_epi32(v, 4);
            lo = _mm512_sub_epi32(_mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xffffu), lo, sixteen), sixteen);
            hi = _mm512_sub_epi32(_mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, sixteen), sixteen);
            __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), scale);
            __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), scale);
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = xf + r * k + b * 32;
                acc[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r]);
                acc[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc[r]);
            }
        }
        for (int64_t r = 0; r < rows; r++) put(out, r * so + n, _mm512_reduce_add_ps(acc[r]), out_bf16);
    }
#else
    (void)xf, (void)blocks, (void)out, (void)rows, (void)n0, (void)n1, (void)n_total, (void)k, (void)so,
        (void)out_bf16;
#endif
}

/* out = x @ w.T for `kind` 0 (int8 codes + float32 scales, q8_rows) or 1 (Q5_0 blocks, q5_rows): x widened
 * to float32 MAX_ROWS rows at a time, output channels split across OpenMP threads in chunks of 64. */
static int blocks_matmul(int kind, const void *x, const void *weight, const float *scales, void *out, int64_t rows,
                         int64_t n, int64_t k, int64_t sx, int64_t so, int dtype, int out_dtype, int64_t block,
                         int num_threads) {
    if ((block != 16 && block != 32) || k % block) return 1;
    if (rows <= 0 || n <= 0) return 0;
    float *xf = malloc((size_t)(rows < MAX_ROWS ? rows : MAX_ROWS) * (size_t)k * sizeof(float));
    if (!xf) return 2;
    size_t out_size = out_dtype ? 2 : 4;
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
        void *out_rows = (char *)out + (size_t)(r0 * so) * out_size;
        /* chunks of 64 outputs: a chunk's codes (64 x K bytes) stream while x stays in L1 */
        int64_t chunks = (n + 63) / 64;
        int threads = n * k >= (1 << 18) ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            int64_t lo = c * 64, hi = lo + 64 < n ? lo + 64 : n;
            if (kind)
                q5_rows(xf, (const uint8_t *)weight, out_rows, count, lo, hi, n, k, so, out_dtype);
            else
                q8_rows(xf, (const int8_t *)weight, scales, out_rows, count, lo, hi, n, k, so, block, out_dtype);
        }
    }
    free(xf);
    return 0;
}

int q8_matmul(const void *x, const int8_t *codes, const float *scales, void *out, int64_t rows, int64_t n,
              int64_t k, int64_t sx, int64_t so, int dtype, int out_dtype, int64_t block, int num_threads) {
    return blocks_matmul(0, x, codes, scales, out, rows, n, k, sx, so, dtype, out_dtype, block, num_threads);
}

/* Q5_0 blocks [N, K / 32 * 22] (the GGUF bytes); 3 when this build has no loop for them (no AVX-512). */
int q5_matmul(const void *x, const uint8_t *blocks, void *out, int64_t rows, int64_t n, int64_t k, int64_t sx,
              int64_t so, int dtype, int out_dtype, int num_threads) {
#if defined(__AVX512F__)
    return blocks_matmul(1, x, blocks, NULL, out, rows, n, k, sx, so, dtype, out_dtype, 32, num_threads);
#else
    (void)x, (void)blocks, (void)out, (void)rows, (void)n, (void)k, (void)sx, (void)so, (void)dtype,
        (void)out_dtype, (void)num_threads;
    return 3;
#endif
}
