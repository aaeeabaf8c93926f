/* Paged decode attention on the CPU: one query token per sequence over its
 * cached K/V, read in place from the paged cache (no gather copy).
 *
 * Plain C (no torch headers), built at first use by kernels/cpu_native.py with
 * -O3 -march=native -fopenmp and called through ctypes. On x86 with AVX2 and
 * FMA the per-tile loops (row conversion, dot products, exponentials, the
 * weighted sum of V) are written in intrinsics; elsewhere they are portable
 * loops for the auto-vectoriser: every inner loop runs over head_dim (or a tile
 * of tokens) with unit stride, and the reductions carry `omp simd` so they may
 * be reassociated.
 *
 * Layouts: q [B, Hq, D] (rows of D contiguous, strides given); k/v cache
 * [num_blocks, block_size, Hkv, D] contiguous; block_tables [B, M] int32 (row
 * stride given); seq_lens [B] int32; out [B, Hq, D] contiguous. Query head h
 * reads KV head h / (Hq / Hkv).
 *
 * Work items are (sequence, KV head, split): a split is a range of the
 * sequence's tokens, so a batch of one still spreads over all threads. Rows
 * that read the same keys (a speculative step's draft rows of one sequence:
 * equal block tables, no window) share an item, which loads each K/V tile
 * once for all of them; each row's arithmetic is what it would be alone. All G
 * query heads of the KV head share each K/V row (converted to float32 once),
 * and softmax runs online per tile of tokens in float32 (base-2, the scale
 * folded into q). With more than one split, each item leaves its unnormalised
 * accumulator and (max, sum) in a float32 scratch and a second pass merges the
 * splits by log-sum-exp.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* x86 with AVX2 + FMA (built with -march=native): the hot loops in intrinsics. Left to the
 * auto-vectoriser, GCC 12 kept the dot products' reductions and the exponentials scalar
 * there. Elsewhere the portable loops below. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define USE_AVX2 1
#else
#define USE_AVX2 0
#endif

enum { DTYPE_F32 = 0, DTYPE_BF16 = 1, DTYPE_F16 = 2 };
enum { OK = 0, ERR_SEQ_LEN = 1, ERR_BLOCK_ID = 2, ERR_ARGS = 3, ERR_NOMEM = 4 };

#define TILE 32          /* tokens per online-softmax step */
#define MIN_SPLIT 128    /* never split a sequence into parts shorter than this */
#define LANES 16         /* floats per inner vector step: one AVX-512 register, two AVX2, four SSE/NEON */
#define LOG2E 1.4426950408889634f
#define MAX_GROUP_ROWS 16 /* rows of one sequence attended together (a speculative step's drafts) */
#define MAX_ITEM_QUERIES 64 /* queries (rows x query heads) an item keeps in its scratch */

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- conversions ------------------------------------------------------- */

ALWAYS_INLINE float bits_to_f32(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

ALWAYS_INLINE uint32_t f32_to_bits(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

ALWAYS_INLINE uint16_t f32_to_bf16(float f)
{
    uint32_t bits = f32_to_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0; /* NaN */
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16); /* round to nearest even */
}

#if defined(__FLT16_MAX__)
typedef _Float16 half_t;
ALWAYS_INLINE float f16_to_f32(half_t h) { return (float)h; }
ALWAYS_INLINE half_t f32_to_f16(float f) { return (half_t)f; }
#else
typedef uint16_t half_t;
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)
        return bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) /* zero or subnormal: man * 2^-24 */
        return sign ? -(float)man * 5.9604644775390625e-8f : (float)man * 5.9604644775390625e-8f;
    return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
static uint16_t f32_to_f16(float f)
{
    uint32_t bits = f32_to_bits(f), sign = (bits >> 16) & 0x8000u, abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (abs >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* below the smallest normal: round to a multiple of 2^-24 */
        float scaled = bits_to_f32(abs) * 16777216.0f;
        return (uint16_t)(sign | (uint32_t)nearbyintf(scaled));
    }
    uint32_t r = abs - (112u << 23);
    r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
    return (uint16_t)(sign | r);
}
#endif

/* One row of D values in the storage dtype -> float32. */
ALWAYS_INLINE void load_row(float *restrict dst, const void *restrict src, int64_t d, int dtype)
{
    if (dtype == DTYPE_F32) {
        memcpy(dst, src, (size_t)d * sizeof(float));
    } else if (dtype == DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        int64_t i = 0;
#if USE_AVX2
        for (; i + 8 <= d; i += 8) {
            __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
        }
#endif
        for (; i < d; i++)
            dst[i] = bits_to_f32((uint32_t)s[i] << 16);
    } else {
        const half_t *s = (const half_t *)src;
        int64_t i = 0;
#if USE_AVX2 && defined(__F16C__)
        for (; i + 8 <= d; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
        for (; i < d; i++)
            dst[i] = f16_to_f32(s[i]);
    }
}

ALWAYS_INLINE void store_row(void *restrict dst, const float *restrict src, int64_t d, int dtype)
{
    if (dtype == DTYPE_F32) {
        memcpy(dst, src, (size_t)d * sizeof(float));
    } else if (dtype == DTYPE_BF16) {
        uint16_t *o = (uint16_t *)dst;
        for (int64_t i = 0; i < d; i++)
            o[i] = f32_to_bf16(src[i]);
    } else {
        half_t *o = (half_t *)dst;
        for (int64_t i = 0; i < d; i++)
            o[i] = f32_to_f16(src[i]);
    }
}

/* Taylor coefficients of 2^f = e^(f ln 2): (ln 2)^k / k!, shared by the scalar and vector versions. */
#define EXP2_C1 6.931471805599453e-01f
#define EXP2_C2 2.402265069591007e-01f
#define EXP2_C3 5.550410866482158e-02f
#define EXP2_C4 9.618129107628477e-03f
#define EXP2_C5 1.3333558146428443e-03f
#define EXP2_C6 1.5403530393381608e-04f
#define EXP2_C7 1.525273380405984e-05f

/* 2^x for x <= 0 (0 below -126), from branch-free operations that vectorise:
 * x = n + f with n an integer and |f| <= 1/2, 2^f by its degree-7 Taylor
 * polynomial (relative error < 1e-8), 2^n built in the exponent bits. */
ALWAYS_INLINE float exp2_nonpos(float x)
{
    const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x < -126.0f ? -126.0f : x;
    float t = xc + shift;
    float n = t - shift;
    float f = xc - n;
    int32_t ni = (int32_t)(f32_to_bits(t) - f32_to_bits(shift));
    float p = EXP2_C7;
    p = p * f + EXP2_C6;
    p = p * f + EXP2_C5;
    p = p * f + EXP2_C4;
    p = p * f + EXP2_C3;
    p = p * f + EXP2_C2;
    p = p * f + EXP2_C1;
    p = p * f + 1.0f;
    float r = p * bits_to_f32((uint32_t)(ni + 127) << 23);
    return x < -126.0f ? 0.0f : r;
}

#if USE_AVX2
/* exp2_nonpos on 8 lanes (the same polynomial, fused multiply-adds; -inf and x < -126 give 0). */
ALWAYS_INLINE __m256 exp2_nonpos8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-126.0f), shift = _mm256_set1_ps(12582912.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 xc = _mm256_max_ps(x, lo);
    __m256 t = _mm256_add_ps(xc, shift);
    __m256 f = _mm256_sub_ps(xc, _mm256_sub_ps(t, shift));
    __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(shift));
    __m256 p = _mm256_set1_ps(EXP2_C7);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C6));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256 pow2n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, pow2n));
}

ALWAYS_INLINE float hsum8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

ALWAYS_INLINE float hmax8(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
#endif

/* ---- the problem -------------------------------------------------------- */

typedef struct {
    const char *q, *k_cache, *v_cache;
    const int32_t *block_tables, *seq_lens;
    char *out;
    float *part_acc; /* [B, Hq, S, D] unnormalised, when S > 1 */
    float *part_ml;  /* [B, Hq, S, 2] running max (log2 domain) and sum */
    int64_t q_stride_b, q_stride_h, bt_stride;
    int64_t batch, num_heads, num_kv_heads, head_dim, block_size, group;
    int64_t token_stride, block_stride; /* elements */
    int64_t esize, num_splits, split_tiles;
    int64_t window; /* > 0: a sliding window, the query at len - 1 sees keys len - window .. len - 1 */
    const int64_t *group_starts; /* [num_groups + 1]: group i is rows group_starts[i] .. group_starts[i + 1] - 1 */
    int64_t num_groups, max_group;
    int64_t heads_per_item; /* KV heads an item attends (whole token rows of the cache) */
    float scale_log2;
    int dtype;
} problem_t;

/* Scratch of one thread: q, acc [G, Dp]; scores [G, TILE]; a tile of K or V rows
 * [TILE, Dp] in float32; running max, sum and rescale factor [G]; row offsets
 * of two tiles.
 * Rows are padded to Dp (a multiple of LANES) with zeros, so the vector loops
 * have no remainders. */
typedef struct {
    float *q, *acc, *scores, *tile, *m, *l, *alpha;
    int64_t *rows;
} scratch_t;

ALWAYS_INLINE int64_t padded(int64_t d) { return (d + LANES - 1) / LANES * LANES; }

static float *alloc_floats(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, (n ? n : 1) * sizeof(float)))
        return NULL;
    return (float *)p;
}

static int scratch_init(scratch_t *s, const problem_t *p)
{
    size_t g = (size_t)(p->group * p->max_group * p->heads_per_item), dp = (size_t)padded(p->head_dim);
    size_t n = 2 * g * dp + g * TILE + TILE * dp + 4 * g + 4 * TILE;
    float *base = alloc_floats(n);
    if (!base)
        return ERR_NOMEM;
    memset(base, 0, n * sizeof(float));
    s->q = base;
    s->acc = s->q + g * dp;
    s->scores = s->acc + g * dp;
    s->tile = s->scores + g * TILE;
    s->m = s->tile + TILE * dp;
    s->l = s->m + g;
    s->alpha = s->l + g;
    s->rows = (int64_t *)(s->alpha + 2 * g); /* 4 * TILE floats = 2 * TILE int64 */
    return OK;
}

/* Element offsets of the rows of tokens [t0, min(t0 + TILE, end)) of KV head h; returns their count. */
ALWAYS_INLINE int64_t tile_rows(const problem_t *restrict p, const int32_t *restrict table, int64_t h,
                                int64_t t0, int64_t end, int64_t *restrict rows)
{
    const int64_t n_tok = end - t0 < TILE ? end - t0 : TILE;
    if (n_tok <= 0)
        return 0;
    /* one division per tile, not per token (a 64-bit divide costs tens of cycles) */
    int64_t j = t0 / p->block_size, off = t0 - j * p->block_size;
    int64_t base = table[j] * p->block_stride + h * p->head_dim;
    for (int64_t n = 0; n < n_tok; n++) {
        if (off == p->block_size) {
            off = 0;
            base = table[++j] * p->block_stride + h * p->head_dim;
        }
        rows[n] = base + off * p->token_stride;
        off++;
    }
    return n_tok;
}

/* The scratch seen from query j0 on: the per-tile functions then work on one row's G queries of a group. */
ALWAYS_INLINE scratch_t row_view(const scratch_t *s, int64_t j0, int64_t dp)
{
    scratch_t v = *s;
    v.q = s->q + j0 * dp;
    v.acc = s->acc + j0 * dp;
    v.scores = s->scores + j0 * TILE;
    v.m = s->m + j0;
    v.l = s->l + j0;
    v.alpha = s->alpha + j0;
    return v;
}

/* ---- one tile of tokens: scores, online softmax, weighted sum of V ------------
 * s->tile holds the tile's K (then V) rows in float32, padded to dp columns; rows at and
 * beyond n_tok hold earlier rows or zeros, whose scores are computed and then ignored. */

#if USE_AVX2
/* q . k of 8 consecutive tile rows as one vector (each lane one row). */
ALWAYS_INLINE __m256 dot8(const float *restrict q, const float *restrict rows, int64_t dp)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t d = 0; d < dp; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 0 * dp + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 1 * dp + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 2 * dp + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 3 * dp + d), a3);
        a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 4 * dp + d), a4);
        a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 5 * dp + d), a5);
        a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 6 * dp + d), a6);
        a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 7 * dp + d), a7);
    }
    /* transpose-and-add: lane i of the result is the full sum of a_i */
    __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/* scores[g, n] = q[g] . k[n] for n < n_tok, in groups of 8 rows (the tile has TILE rows). */
ALWAYS_INLINE void tile_scores(scratch_t *restrict s, int64_t G, int64_t dp, int64_t n_tok)
{
    for (int64_t g = 0; g < G; g++)
        for (int64_t n = 0; n < n_tok; n += 8)
            _mm256_storeu_ps(s->scores + g * TILE + n, dot8(s->q + g * dp, s->tile + n * dp, dp));
}

/* Online softmax over the first n_tok scores of each head: new max, weights, running sum. */
ALWAYS_INLINE void tile_softmax(scratch_t *restrict s, int64_t G, int64_t n_tok)
{
    const int64_t n_vec = (n_tok + 7) / 8 * 8;
    for (int64_t g = 0; g < G; g++) {
        float *sc = s->scores + g * TILE;
        for (int64_t n = n_tok; n < n_vec; n++)
            sc[n] = -INFINITY;
        __m256 mv = _mm256_set1_ps(s->m[g]);
        for (int64_t n = 0; n < n_vec; n += 8)
            mv = _mm256_max_ps(mv, _mm256_loadu_ps(sc + n));
        const float mx = hmax8(mv);
        const __m256 mb = _mm256_set1_ps(mx);
        __m256 sum = _mm256_setzero_ps();
        for (int64_t n = 0; n < n_vec; n += 8) {
            __m256 e = exp2_nonpos8(_mm256_sub_ps(_mm256_loadu_ps(sc + n), mb));
            _mm256_storeu_ps(sc + n, e);
            sum = _mm256_add_ps(sum, e);
        }
        s->alpha[g] = exp2_nonpos(s->m[g] - mx);
        s->l[g] = s->l[g] * s->alpha[g] + hsum8(sum);
        s->m[g] = mx;
    }
}

/* acc[g] = acc[g] * alpha[g] + sum_n p[g, n] * v[n], 32 (then 16) columns in registers. */
ALWAYS_INLINE void tile_accumulate(scratch_t *restrict s, int64_t G, int64_t dp, int64_t n_tok)
{
    for (int64_t g = 0; g < G; g++) {
        const float *restrict pw = s->scores + g * TILE;
        float *restrict acc = s->acc + g * dp;
        const __m256 alpha = _mm256_set1_ps(s->alpha[g]);
        int64_t d0 = 0;
        for (; d0 + 32 <= dp; d0 += 32) {
            __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d0), alpha);
            __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d0 + 8), alpha);
            __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + d0 + 16), alpha);
            __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + d0 + 24), alpha);
            for (int64_t n = 0; n < n_tok; n++) {
                const __m256 w = _mm256_broadcast_ss(pw + n);
                const float *restrict vf = s->tile + n * dp + d0;
                a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vf), a0);
                a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vf + 8), a1);
                a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vf + 16), a2);
                a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vf + 24), a3);
            }
            _mm256_storeu_ps(acc + d0, a0);
            _mm256_storeu_ps(acc + d0 + 8, a1);
            _mm256_storeu_ps(acc + d0 + 16, a2);
            _mm256_storeu_ps(acc + d0 + 24, a3);
        }
        for (; d0 < dp; d0 += 16) { /* dp is a multiple of 16 */
            __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d0), alpha);
            __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d0 + 8), alpha);
            for (int64_t n = 0; n < n_tok; n++) {
                const __m256 w = _mm256_broadcast_ss(pw + n);
                a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(s->tile + n * dp + d0), a0);
                a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(s->tile + n * dp + d0 + 8), a1);
            }
            _mm256_storeu_ps(acc + d0, a0);
            _mm256_storeu_ps(acc + d0 + 8, a1);
        }
    }
}
#else
/* scores[g, n] = q[g] . k[n] (log2 domain): LANES partial sums, then a tree */
ALWAYS_INLINE void tile_scores(scratch_t *restrict s, int64_t G, int64_t dp, int64_t n_tok)
{
    for (int64_t n = 0; n < n_tok; n++) {
        const float *restrict kf = s->tile + n * dp;
        for (int64_t g = 0; g < G; g++) {
            const float *restrict qf = s->q + g * dp;
            float part[LANES] = {0};
            for (int64_t d0 = 0; d0 < dp; d0 += LANES)
                for (int l = 0; l < LANES; l++)
                    part[l] += qf[d0 + l] * kf[d0 + l];
            for (int w = LANES / 2; w > 0; w /= 2)
                for (int l = 0; l < w; l++)
                    part[l] += part[l + w];
            s->scores[g * TILE + n] = part[0];
        }
    }
}

/* online softmax: new max, then the weights and the running sum */
ALWAYS_INLINE void tile_softmax(scratch_t *restrict s, int64_t G, int64_t n_tok)
{
    for (int64_t g = 0; g < G; g++) {
        float *sc = s->scores + g * TILE;
        float mx = s->m[g];
        for (int64_t n = 0; n < n_tok; n++)
            mx = sc[n] > mx ? sc[n] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t n = 0; n < n_tok; n++) {
            float e = exp2_nonpos(sc[n] - mx);
            sc[n] = e;
            sum += e;
        }
        s->alpha[g] = exp2_nonpos(s->m[g] - mx);
        s->l[g] = s->l[g] * s->alpha[g] + sum;
        s->m[g] = mx;
    }
}

/* acc[g] = acc[g] * alpha[g] + sum_n p[g, n] * v[n], LANES columns at a time in registers */
ALWAYS_INLINE void tile_accumulate(scratch_t *restrict s, int64_t G, int64_t dp, int64_t n_tok)
{
    for (int64_t g = 0; g < G; g++) {
        const float *restrict pw = s->scores + g * TILE;
        float *restrict acc = s->acc + g * dp;
        const float a0 = s->alpha[g];
        for (int64_t d0 = 0; d0 < dp; d0 += LANES) {
            float a[LANES];
            for (int l = 0; l < LANES; l++)
                a[l] = acc[d0 + l] * a0;
            for (int64_t n = 0; n < n_tok; n++) {
                const float w = pw[n];
                const float *restrict vf = s->tile + n * dp + d0;
                for (int l = 0; l < LANES; l++)
                    a[l] += w * vf[l];
            }
            for (int l = 0; l < LANES; l++)
                acc[d0 + l] = a[l];
        }
    }
}
#endif

/* The first key a sequence of `len` tokens attends to from its last position (0 without a window). */
ALWAYS_INLINE int64_t visible_from(int64_t len, int64_t window)
{
    return window > 0 && len > window ? len - window : 0;
}

/* Attend one (row group, KV heads h0 .. h1 - 1, split) item. A group is rows b0 .. b1 - 1 whose block tables
 * agree over every block they read and that have no window (group_starts): they read the same keys, so each
 * tile of K and V is loaded and converted once for all of them (a speculative step's draft rows of one
 * sequence). An item takes several KV heads so that it reads whole token rows of the cache (the heads of a
 * token are contiguous), not one head's slice of each. Each (row, head) keeps its own G queries and each row its
 * own end (keys lo + split * span up to its own length): a query takes exactly the tiles, scores and sums it
 * would take in an item of its own, so its result is the same bits. Query j = ((h - h0) * R + r) * G + g. */
ALWAYS_INLINE void attend_item(const problem_t *restrict p, scratch_t *restrict s,
                               int64_t b0, int64_t b1, int64_t h0, int64_t h1, int64_t split, int dtype, int64_t dp)
{
    const int64_t D = p->head_dim, G = p->group, R = b1 - b0;
    const int64_t span = p->split_tiles * TILE;
    const int32_t *table = p->block_tables + b0 * p->bt_stride;
    const int64_t esize = p->esize;
    /* every row of a group starts at the same key (lo is 0 for a group of more than one row) */
    const int64_t start = visible_from(p->seq_lens[b0], p->window) + split * span;
    int64_t ends[MAX_GROUP_ROWS], end = start;
    for (int64_t r = 0; r < R; r++) {
        const int64_t len = p->seq_lens[b0 + r];
        ends[r] = start + span < len ? start + span : len;
        end = ends[r] > end ? ends[r] : end;
    }

    for (int64_t h = h0; h < h1; h++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t g = 0; g < G; g++) {
                const int64_t j = ((h - h0) * R + r) * G + g;
                const char *qrow = p->q + ((b0 + r) * p->q_stride_b + (h * G + g) * p->q_stride_h) * esize;
                float *qf = s->q + j * dp;
                load_row(qf, qrow, D, dtype);
                for (int64_t d = 0; d < D; d++)
                    qf[d] *= p->scale_log2;
                float *acc = s->acc + j * dp;
                for (int64_t d = 0; d < D; d++)
                    acc[d] = 0.0f;
                s->m[j] = -INFINITY;
                s->l[j] = 0.0f;
            }

    /* rows[n]: token n's row of head 0; head h's keys are h * D further */
    int64_t *rows = s->rows, *next = s->rows + TILE;
    tile_rows(p, table, 0, start, end, next);
    const int64_t heads_bytes = (h1 - h0) * D * esize, first = h0 * D;
    for (int64_t t0 = start; t0 < end; t0 += TILE) {
        const int64_t n_tok = end - t0 < TILE ? end - t0 : TILE;
        int64_t *swap = rows;
        rows = next;
        next = swap;
        /* the next tile's rows are fetched while this one is computed (the blocks are scattered,
         * which defeats the hardware prefetchers) */
        const int64_t n_next = tile_rows(p, table, 0, t0 + TILE, end, next);
        for (int64_t n = 0; n < n_next; n++)
            for (int64_t off = 0; off < heads_bytes; off += 64) {
                __builtin_prefetch(p->k_cache + (next[n] + first) * esize + off, 0, 3);
                __builtin_prefetch(p->v_cache + (next[n] + first) * esize + off, 0, 3);
            }
        for (int64_t h = h0; h < h1; h++) {
            for (int64_t n = 0; n < n_tok; n++)
                load_row(s->tile + n * dp, p->k_cache + (rows[n] + h * D) * esize, D, dtype);
            for (int64_t r = 0; r < R; r++) {
                const int64_t mine = ends[r] - t0 < TILE ? ends[r] - t0 : TILE;
                if (mine <= 0)
                    continue; /* this row's keys ended in an earlier tile */
                scratch_t v = row_view(s, ((h - h0) * R + r) * G, dp);
                tile_scores(&v, G, dp, mine);
                tile_softmax(&v, G, mine);
            }
            for (int64_t n = 0; n < n_tok; n++)
                load_row(s->tile + n * dp, p->v_cache + (rows[n] + h * D) * esize, D, dtype);
            for (int64_t r = 0; r < R; r++) {
                const int64_t mine = ends[r] - t0 < TILE ? ends[r] - t0 : TILE;
                if (mine <= 0)
                    continue;
                scratch_t v = row_view(s, ((h - h0) * R + r) * G, dp);
                tile_accumulate(&v, G, dp, mine);
            }
        }
    }

    for (int64_t h = h0; h < h1; h++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t g = 0; g < G; g++) {
                const int64_t head = h * G + g, j = ((h - h0) * R + r) * G + g, b = b0 + r;
                float *acc = s->acc + j * dp;
                if (p->num_splits == 1) {
                    float inv = s->l[j] > 0.0f ? 1.0f / s->l[j] : 0.0f;
                    for (int64_t d = 0; d < D; d++)
                        acc[d] *= inv;
                    store_row(p->out + ((b * p->num_heads + head) * D) * esize, acc, D, dtype);
                } else {
                    int64_t slot = (b * p->num_heads + head) * p->num_splits + split;
                    memcpy(p->part_acc + slot * D, acc, (size_t)D * sizeof(float));
                    p->part_ml[2 * slot] = s->m[j];
                    p->part_ml[2 * slot + 1] = s->l[j];
                }
            }
}

/* Merge the splits of (sequence b, query head) by log-sum-exp. */
ALWAYS_INLINE void merge_head(const problem_t *restrict p, float *restrict row, int64_t b, int64_t head,
                              int dtype)
{
    const int64_t D = p->head_dim, S = p->num_splits;
    const int64_t base = (b * p->num_heads + head) * S;
    float top = -INFINITY;
    for (int64_t sp = 0; sp < S; sp++) {
        float m = p->part_ml[2 * (base + sp)];
        top = m > top ? m : top;
    }
    for (int64_t d = 0; d < D; d++)
        row[d] = 0.0f;
    float total = 0.0f;
    for (int64_t sp = 0; sp < S; sp++) {
        float l = p->part_ml[2 * (base + sp) + 1];
        if (l <= 0.0f) /* an empty split */
            continue;
        float w = exp2_nonpos(p->part_ml[2 * (base + sp)] - top);
        total += l * w;
        const float *part = p->part_acc + (base + sp) * D;
        for (int64_t d = 0; d < D; d++)
            row[d] += w * part[d];
    }
    float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int64_t d = 0; d < D; d++)
        row[d] *= inv;
    store_row(p->out + ((b * p->num_heads + head) * D) * p->esize, row, D, dtype);
}

ALWAYS_INLINE int run_items(const problem_t *restrict p, int nthreads, int dtype)
{
    const int64_t chunks = (p->num_kv_heads + p->heads_per_item - 1) / p->heads_per_item;
    const int64_t items = p->num_groups * chunks * p->num_splits;
    const int64_t merges = p->num_splits > 1 ? p->batch * p->num_heads : 0;
    const int64_t dp = padded(p->head_dim);
    int status = OK;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        scratch_t s = {0};
        int mine = scratch_init(&s, p);
        if (mine != OK) {
#pragma omp atomic write
            status = mine;
        }
#pragma omp barrier
        int failed;
#pragma omp atomic read
        failed = status;
        if (failed == OK) {
            /* sequences first, so a thread's consecutive items share a block table row */
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < items; i++) {
                int64_t split = i % p->num_splits;
                int64_t rest = i / p->num_splits;
                int64_t grp = rest / chunks, h0 = rest % chunks * p->heads_per_item;
                int64_t h1 = h0 + p->heads_per_item < p->num_kv_heads ? h0 + p->heads_per_item : p->num_kv_heads;
                int64_t b0 = p->group_starts[grp], b1 = p->group_starts[grp + 1];
                /* constant padded widths for the common head sizes, so their loops unroll fully */
                if (dp == 64)
                    attend_item(p, &s, b0, b1, h0, h1, split, dtype, 64);
                else if (dp == 128)
                    attend_item(p, &s, b0, b1, h0, h1, split, dtype, 128);
                else
                    attend_item(p, &s, b0, b1, h0, h1, split, dtype, dp);
            }
#pragma omp for schedule(static)
            for (int64_t i = 0; i < merges; i++)
                merge_head(p, s.tile, i / p->num_heads, i % p->num_heads, dtype);
        }
        if (mine == OK)
            free(s.q);
    }
    return status;
}

/* Whether a row of `len` keys reads the same blocks through table `b` as through table `a`. */
static int same_blocks(const int32_t *a, const int32_t *b, int64_t len, int64_t block_size)
{
    const int64_t blocks = (len + block_size - 1) / block_size;
    for (int64_t j = 0; j < blocks; j++)
        if (a[j] != b[j])
            return 0;
    return 1;
}

/* Splits per sequence: enough items for every thread (several each, for
 * balance), none shorter than MIN_SPLIT tokens. */
static int64_t choose_splits(int64_t batch, int64_t num_kv_heads, int64_t max_len, int nthreads)
{
    int64_t want_items = 8 * (int64_t)nthreads;
    int64_t have = batch * num_kv_heads;
    if (nthreads <= 1 || have >= want_items)
        return 1;
    int64_t splits = (want_items + have - 1) / have;
    int64_t most = max_len / MIN_SPLIT;
    if (splits > most)
        splits = most;
    return splits < 1 ? 1 : splits;
}

/* Returns 0 on success, else an ERR_* code (nothing written to out). */
int paged_decode_attention(
    const void *q, int64_t q_stride_b, int64_t q_stride_h,
    const void *k_cache, const void *v_cache,
    int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
    const int32_t *block_tables, int64_t bt_stride, int64_t max_blocks,
    const int32_t *seq_lens, void *out,
    int64_t batch, int64_t num_heads, int64_t head_dim,
    float scale, int dtype, int64_t num_splits, int num_threads, int64_t window)
{
    if (window < 0)
        return ERR_ARGS;
    if (batch < 0 || num_heads < 1 || num_kv_heads < 1 || num_heads % num_kv_heads || head_dim < 1 ||
        block_size < 1 || num_blocks < 0 || max_blocks < 0 ||
        (dtype != DTYPE_F32 && dtype != DTYPE_BF16 && dtype != DTYPE_F16))
        return ERR_ARGS;
    /* validate every length and every block id read, so bad metadata cannot read out of bounds
     * (with a window, only the blocks it reads: those before it may have been given back) */
    int64_t max_len = 0;
    for (int64_t b = 0; b < batch; b++) {
        int64_t len = seq_lens[b];
        if (len < 0 || len > max_blocks * block_size)
            return ERR_SEQ_LEN;
        int64_t lo = visible_from(len, window);
        max_len = len - lo > max_len ? len - lo : max_len;
        const int32_t *table = block_tables + b * bt_stride;
        for (int64_t j = lo / block_size; j < (len + block_size - 1) / block_size; j++)
            if (table[j] < 0 || table[j] >= num_blocks)
                return ERR_BLOCK_ID;
    }
    if (batch == 0)
        return OK;
    int nthreads = num_threads < 1 ? 1 : num_threads;
    problem_t p = {
        .q = (const char *)q, .k_cache = (const char *)k_cache, .v_cache = (const char *)v_cache,
        .block_tables = block_tables, .seq_lens = seq_lens, .out = (char *)out,
        .q_stride_b = q_stride_b, .q_stride_h = q_stride_h, .bt_stride = bt_stride,
        .batch = batch, .num_heads = num_heads, .num_kv_heads = num_kv_heads, .head_dim = head_dim,
        .block_size = block_size, .group = num_heads / num_kv_heads,
        .token_stride = num_kv_heads * head_dim, .block_stride = block_size * num_kv_heads * head_dim,
        .esize = dtype == DTYPE_F32 ? 4 : 2,
        .window = window, .scale_log2 = scale * LOG2E, .dtype = dtype,
    };
    /* rows that read the same keys (equal block tables over all they read, no window) attend as one group;
     * the splits stay those of the rows alone, so grouping changes no row's result */
    int64_t *starts = (int64_t *)malloc((size_t)(batch + 1) * sizeof(int64_t));
    if (!starts)
        return ERR_NOMEM;
    int64_t groups = 0, widest = 1;
    starts[0] = 0;
    for (int64_t b = 0; b < batch;) {
        int64_t e = b + 1;
        while (window == 0 && e < batch && e - b < MAX_GROUP_ROWS &&
               same_blocks(block_tables + b * bt_stride, block_tables + e * bt_stride, seq_lens[e], block_size))
            e++;
        widest = e - b > widest ? e - b : widest;
        starts[++groups] = e;
        b = e;
    }
    p.group_starts = starts;
    p.num_groups = groups;
    p.max_group = widest;
    /* as many KV heads an item as keep its queries within MAX_ITEM_QUERIES */
    p.heads_per_item = MAX_ITEM_QUERIES / (p.group * widest);
    if (p.heads_per_item < 1)
        p.heads_per_item = 1;
    if (p.heads_per_item > num_kv_heads)
        p.heads_per_item = num_kv_heads;
    int64_t tiles = (max_len + TILE - 1) / TILE;
    if (num_splits < 0) {
        /* parts of a fixed -num_splits tiles from each row's first key: a row's parts, and so its sums, depend
         * on its own length only (batch-invariant mode); a row with fewer parts than the batch's longest
         * leaves the rest empty, which the merge skips, and one part merged is the unsplit result bit for bit
         * (weight exp2(0) = 1, 0 + x = x, the same 1 / l) */
        p.split_tiles = -num_splits;
        p.num_splits = (tiles + p.split_tiles - 1) / p.split_tiles;
        if (p.num_splits < 1)
            p.num_splits = 1;
    } else {
        p.num_splits = num_splits > 0 ? num_splits : choose_splits(batch, num_kv_heads, max_len, nthreads);
        p.split_tiles = (tiles + p.num_splits - 1) / p.num_splits;
        if (p.split_tiles < 1)
            p.split_tiles = 1;
    }
    if (p.num_splits > 1) {
        size_t slots = (size_t)batch * (size_t)num_heads * (size_t)p.num_splits;
        p.part_acc = alloc_floats(slots * (size_t)head_dim);
        p.part_ml = alloc_floats(slots * 2);
        if (!p.part_acc || !p.part_ml) {
            free(p.part_acc);
            free(p.part_ml);
            free(starts);
            return ERR_NOMEM;
        }
    }
    int status;
    switch (dtype) { /* one copy of the loops per storage type */
    case DTYPE_F32: status = run_items(&p, nthreads, DTYPE_F32); break;
    case DTYPE_BF16: status = run_items(&p, nthreads, DTYPE_BF16); break;
    default: status = run_items(&p, nthreads, DTYPE_F16); break;
    }
    free(p.part_acc);
    free(p.part_ml);
    free(starts);
    return status;
}

/* Lets the loader check it has the library it expects. */
int paged_decode_attention_abi_version(void) { return 4; }

/* 1 when the AVX2/FMA loops were compiled in, 0 for the portable ones (tests, diagnostics). */
int paged_decode_attention_uses_avx2(void) { return USE_AVX2; }
