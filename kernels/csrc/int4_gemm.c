/* out[r, n] = sum_k x[r, k] * w[n, k] for a weight packed by PyTorch's `_convert_weight_to_int4pack_for_cpu`
 * (4-bit codes, bf16 scales and zeros per group of K), with the very bits of `_weight_int4pack_mm_for_cpu`
 * at any row count, and fast at many rows.
 *
 * PyTorch's kernel dequantises every weight again for every 4 rows, in registers: right for the 1-8 rows of a
 * decode step, ~2x slower per row than a float32 GEMM at 64. Here a block of output columns is dequantised
 * once into a float32 panel (the same FMAs PyTorch does: the same weight values), and then every row tile is a
 * plain register-blocked GEMM over it. Each output is still PyTorch's one chain: c = 0, then c = fma(x[k],
 * w[k], c) for k = 0, 1, ..., K - 1, then one round to bf16 (to nearest even, NaN -> 0xffff as ATen's
 * cvtfp32_bf16). Tiling rows and columns, and threads, never change that chain, so a row's result is the
 * same alone, beside any rows, and through either kernel: the engine picks by row count freely.
 *
 * `variant` names PyTorch's build this replicates (kernels/int4_gemm_cpu.py checks against the live kernel
 * which one, if any, gives its bits, before using this):
 *   0  its AVX2 kernel: columns in blocks of 32, byte d of a K row holds column d (low nibble) and d + 16
 *      (high); w = fma(code, scale, fma(scale, -8, zero)).
 *   1  its AVX-512 kernel: blocks of 64, byte d holds columns d and d + 32, byte 16 + d columns d + 16 and
 *      d + 48; w = fma(code - 8, scale, zero).
 * A last, narrower block (16, or 16/32/48 for variant 1) holds column pairs: byte j is 2j (low) and 2j + 1.
 * Scales and zeros: bf16 [K / group, N, 2]. x: bf16 [rows, K] (row stride sx); out bf16 [rows, N] (stride so).
 * Returns 0; 1 for a shape it does not take (N not a multiple of 16, K of group); 2 when out of memory.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define I4_STRIP 16 /* panel columns per strip: two AVX2 vectors */
#define I4_MR 6     /* rows per register tile: 6 x 2 accumulators */
#define I4_MC 96    /* rows per task: a task dequantises its block once for these */

static inline uint16_t i4_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f) return 0xffff;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* One K row of a strip's 16 weights into dst: fma(code, scale, zero) with zero already fma(scale, -8, zero)
 * (variant 0), or fma(code - 8, scale, zero) (variant 1): PyTorch's FMAs, so the same weight values. code0 holds
 * columns 0-7, code1 columns 8-15. */
#if defined(__AVX2__) && defined(__FMA__)
static inline void i4_store_strip(float *dst, __m256 code0, __m256 code1, const float *scale, const float *zero,
                                  int variant) {
    __m256 s0 = _mm256_loadu_ps(scale), s1 = _mm256_loadu_ps(scale + 8);
    __m256 z0 = _mm256_loadu_ps(zero), z1 = _mm256_loadu_ps(zero + 8);
    if (variant) {
        const __m256 eight = _mm256_set1_ps(8.0f);
        code0 = _mm256_sub_ps(code0, eight);
        code1 = _mm256_sub_ps(code1, eight);
    }
    _mm256_storeu_ps(dst, _mm256_fmadd_ps(code0, s0, z0));
    _mm256_storeu_ps(dst + 8, _mm256_fmadd_ps(code1, s1, z1));
}

/* Nibbles of 8 bytes as 8 float32 codes: the low (high = 0) or high (high = 1) nibble of each. */
static inline __m256 i4_codes8(const uint8_t *bytes, int high) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bytes));
    b = high ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(0xF));
    return _mm256_cvtepi32_ps(b);
}

/* 16 consecutive columns held as pairs in 8 bytes (byte j: column 2j low, 2j + 1 high), as float32 codes. */
static inline void i4_codes_pairs(const uint8_t *bytes, __m256 *c0, __m256 *c1) {
    float code[16];
    for (int j = 0; j < 8; j++) {
        code[2 * j] = (float)(bytes[j] & 15);
        code[2 * j + 1] = (float)(bytes[j] >> 4);
    }
    *c0 = _mm256_loadu_ps(code);
    *c1 = _mm256_loadu_ps(code + 8);
}
#endif

/* Block [n0, n0 + nbs) dequantised into p, strip-major: p[(s * K + k) * 16 + j] is column n0 + 16 s + j. */
static void i4_panel(float *p, const uint8_t *b, const uint16_t *sz, int64_t n0, int nbs, int full, int64_t n,
                     int64_t k, int64_t group, int variant) {
    float scale[64], zero[64];
    const int half = nbs / 2, strips = nbs / I4_STRIP;
    for (int64_t kk = 0; kk < k; kk++) {
        if (kk % group == 0) {
            const uint16_t *s = sz + (kk / group) * n * 2 + n0 * 2;
            for (int c = 0; c < nbs; c++) {
                scale[c] = bf16_to_f32(s[2 * c]);
                float z = bf16_to_f32(s[2 * c + 1]);
                zero[c] = variant == 0 ? fmaf(scale[c], -8.0f, z) : z;
            }
        }
        const uint8_t *row = b + kk * half;
#if defined(__AVX2__) && defined(__FMA__)
        for (int st = 0; st < strips; st++) {
            __m256 c0, c1;
            if (full && variant == 0) { /* strip 0: low nibbles of bytes 0-15, strip 1: their high nibbles */
                c0 = i4_codes8(row, st);
                c1 = i4_codes8(row + 8, st);
            } else if (full) { /* strips 0..3: low of 0-15, low of 16-31, high of 0-15, high of 16-31 */
                const uint8_t *at = row + (st & 1) * 16;
                c0 = i4_codes8(at, st >> 1);
                c1 = i4_codes8(at + 8, st >> 1);
            } else {
                i4_codes_pairs(row + st * 8, &c0, &c1);
            }
            i4_store_strip(p + ((int64_t)st * k + kk) * I4_STRIP, c0, c1, scale + st * 16, zero + st * 16, variant);
        }
#else
        float code[64];
        if (full && variant == 0) {
            for (int d = 0; d < 16; d++) {
                code[d] = (float)(row[d] & 15);
                code[d + 16] = (float)(row[d] >> 4);
            }
        } else if (full) {
            for (int d = 0; d < 16; d++) {
                code[d] = (float)(row[d] & 15);
                code[d + 32] = (float)(row[d] >> 4);
                code[d + 16] = (float)(row[16 + d] & 15);
                code[d + 48] = (float)(row[16 + d] >> 4);
            }
        } else {
            for (int j = 0; j < half; j++) {
                code[2 * j] = (float)(row[j] & 15);
                code[2 * j + 1] = (float)(row[j] >> 4);
            }
        }
        for (int c = 0; c < nbs; c++) {
            float w = variant == 0 ? fmaf(code[c], scale[c], zero[c]) : fmaf(code[c] - 8.0f, scale[c], zero[c]);
            p[((int64_t)(c / I4_STRIP) * k + kk) * I4_STRIP + c % I4_STRIP] = w;
        }
#endif
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* 16 float32 sums -> bf16 as ATen's cvtfp32_bf16: + 0x7fff + lsb, >> 16; NaN -> 0xffff. */
static inline void i4_store_row(uint16_t *out, __m256 lo, __m256 hi) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), nan = _mm256_set1_epi32(0xffff);
    __m256i v[2];
    __m256 f[2] = {lo, hi};
    for (int h = 0; h < 2; h++) {
        __m256i u = _mm256_castps_si256(f[h]);
        __m256i t = _mm256_add_epi32(_mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), one), bias), u);
        t = _mm256_srli_epi32(t, 16);
        v[h] = _mm256_blendv_epi8(nan, t, _mm256_castps_si256(_mm256_cmp_ps(f[h], f[h], _CMP_ORD_Q)));
    }
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v[0], v[1]), 0xd8);
    _mm256_storeu_si256((__m256i *)out, packed);
}

/* One row's two accumulators c##r##0, c##r##1, declared, updated with the row's x[k], stored. */
#define I4_DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps()
#define I4_STEP(r)                                                                                                     \
    if (rows > r) {                                                                                                    \
        __m256 av = _mm256_broadcast_ss(a + r * k + kk);                                                               \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);                                                                   \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);                                                                   \
    }
#define I4_STORE(r) \
    if (rows > r) i4_store_row(out + r * so, c##r##0, c##r##1)
#endif

/* rows (<= I4_MR) rows of a (float32, row stride k) times one strip ps ([K, 16]) into out's 16 columns. Each
 * output: one accumulator lane, fma in k order from 0 (the chain the C file's head describes). */
static inline __attribute__((always_inline)) void i4_tile(const float *a, const float *ps, uint16_t *out,
                                                          int64_t so, int64_t k, const int rows) {
#if defined(__AVX2__) && defined(__FMA__)
    I4_DECL(0); I4_DECL(1); I4_DECL(2); I4_DECL(3); I4_DECL(4); I4_DECL(5);
    for (int64_t kk = 0; kk < k; kk++) {
        __m256 b0 = _mm256_loadu_ps(ps + kk * I4_STRIP), b1 = _mm256_loadu_ps(ps + kk * I4_STRIP + 8);
        I4_STEP(0) I4_STEP(1) I4_STEP(2) I4_STEP(3) I4_STEP(4) I4_STEP(5)
    }
    I4_STORE(0); I4_STORE(1); I4_STORE(2); I4_STORE(3); I4_STORE(4); I4_STORE(5);
#else
    for (int r = 0; r < rows; r++) {
        float c[16] = {0};
        for (int64_t kk = 0; kk < k; kk++)
            for (int j = 0; j < 16; j++) c[j] = fmaf(a[r * k + kk], ps[kk * I4_STRIP + j], c[j]);
        for (int j = 0; j < 16; j++) out[r * so + j] = i4_to_bf16(c[j]);
    }
#endif
}

static void i4_rows(const float *a, const float *ps, uint16_t *out, int64_t so, int64_t k, int64_t rows) {
    switch (rows) {
    case 1: i4_tile(a, ps, out, so, k, 1); break;
    case 2: i4_tile(a, ps, out, so, k, 2); break;
    case 3: i4_tile(a, ps, out, so, k, 3); break;
    case 4: i4_tile(a, ps, out, so, k, 4); break;
    case 5: i4_tile(a, ps, out, so, k, 5); break;
    default: i4_tile(a, ps, out, so, k, 6); break;
    }
}

/* Which column blocking PyTorch's CPU kernel was built with for `variant` (32: AVX2, 64: AVX-512). */
static int i4_block_n(int variant) { return variant == 0 ? 32 : 64; }

int int4_gemm(const uint16_t *x, const uint8_t *packed, const uint16_t *sz, uint16_t *out, int64_t rows,
              int64_t n, int64_t k, int64_t sx, int64_t so, int64_t group, int variant, int num_threads) {
    if (rows <= 0 || n <= 0) return 0;
    if (n % 16 || k <= 0 || group <= 0 || k % group || (variant != 0 && variant != 1)) return 1;
    const int block_n = i4_block_n(variant);
    const int64_t blocks = (n + block_n - 1) / block_n, chunks = (rows + I4_MC - 1) / I4_MC;
    float *a = (float *)malloc((size_t)rows * k * sizeof(float));
    if (!a) return 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t kk = 0; kk < k; kk++) a[r * k + kk] = bf16_to_f32(x[r * sx + kk]);
    int threads = num_threads < 1 ? 1 : num_threads;
    if (threads > blocks * chunks) threads = (int)(blocks * chunks);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *p = (float *)malloc((size_t)k * block_n * sizeof(float));
        if (!p) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t task = 0; task < blocks * chunks; task++) {
            if (!p) continue;
            int64_t nb = task / chunks, m0 = (task % chunks) * I4_MC, n0 = nb * block_n;
            int64_t m1 = m0 + I4_MC < rows ? m0 + I4_MC : rows;
            int nbs = (int)(n - n0 < block_n ? n - n0 : block_n);
            i4_panel(p, packed + n0 * k / 2, sz, n0, nbs, nbs == block_n, n, k, group, variant);
            for (int64_t m = m0; m < m1; m += I4_MR) {
                int64_t mr = m1 - m < I4_MR ? m1 - m : I4_MR;
                for (int s = 0; s < nbs / I4_STRIP; s++)
                    i4_rows(a + m * k, p + (int64_t)s * k * I4_STRIP, out + m * so + n0 + s * I4_STRIP, so, k, mr);
            }
        }
        free(p);
    }
    free(a);
    return failed ? 2 : 0;
}
