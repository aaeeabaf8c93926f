/* Fused elementwise ops for the CPU path: RMSNorm (+ residual add), rotary
 * embedding, SiLU-and-multiply and the K/V cache write.
 *
 * Each function does in one pass what the PyTorch references do in 5-12
 * tensor ops, with the same rounding steps: model-dtype values are rounded
 * where the references round them (bf16 round-to-nearest-even), arithmetic in
 * float32, and no fused multiply-adds (built with -ffp-contract=off) so the
 * rotary products round like HF's `q * cos + rotate_half(q) * sin`.
 * Reductions use 16 float32 partial sums, so a row's variance may differ from
 * PyTorch's in the last bit.
 *
 * Built by kernels/cpu_native.py with -O3 -march=native -fno-trapping-math
 * (which lets GCC vectorise the loops, exp_approx's clamps included); the
 * pragma below turns off FMA contraction for this file only.
 *
 * dtype codes: 0 float32, 1 bfloat16. Strides are in elements.
 */
#pragma GCC optimize("fp-contract=off")

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define MAX_HIDDEN 16384

static inline void load_row(const void *src, int64_t offset, int64_t n, int dtype, float *dst) {
    if (dtype) {
        const uint16_t *s = (const uint16_t *)src + offset;
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    } else {
        memcpy(dst, (const float *)src + offset, (size_t)n * 4);
    }
}

static inline void store_row(void *dst, int64_t offset, int64_t n, int dtype, const float *src) {
    if (dtype) {
        uint16_t *d = (uint16_t *)dst + offset;
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
    } else {
        memcpy((float *)dst + offset, src, (size_t)n * 4);
    }
}

static float sum_squares(const float *v, int64_t n) {
    float part[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) part[j] += v[i + j] * v[i + j];
    float total = 0.0f;
    for (int j = 0; j < 16; j++) total += part[j];
    for (; i < n; i++) total += v[i] * v[i];
    return total;
}

/* new_res = x + res (rounded to the dtype); out = rms_norm(new_res) * weight.
 * Without a residual (res == NULL) new_res is not written. weight_f32: the
 * weight is float32 (Gemma's 1 + weight) and multiplies the float32
 * normalised row, rounded once to the dtype (transformers' Gemma3RMSNorm);
 * otherwise it is in the dtype and multiplies the row already rounded to the
 * dtype (HF Llama). */
void rms_norm_rows(const void *x, const void *res, const void *weight, void *out, void *new_res,
                   int64_t rows, int64_t hidden, int64_t sx, int64_t sr, int64_t so, int64_t sn,
                   float eps, int dtype, int weight_f32, int num_threads) {
    int threads = rows * hidden >= 65536 ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float v[MAX_HIDDEN], w[MAX_HIDDEN];
        load_row(x, r * sx, hidden, dtype, v);
        if (res) {
            float tmp[MAX_HIDDEN];
            load_row(res, r * sr, hidden, dtype, tmp);
            if (dtype)
                for (int64_t i = 0; i < hidden; i++) v[i] = bf16_to_f32(f32_to_bf16(v[i] + tmp[i]));
            else
                for (int64_t i = 0; i < hidden; i++) v[i] += tmp[i];
            store_row(new_res, r * sn, hidden, dtype, v);
        }
        float inv = 1.0f / sqrtf(sum_squares(v, hidden) / (float)hidden + eps);
        load_row(weight, 0, hidden, weight_f32 ? 0 : dtype, w);
        if (dtype && !weight_f32)
            for (int64_t i = 0; i < hidden; i++) v[i] = bf16_to_f32(f32_to_bf16(v[i] * inv)) * w[i];
        else
            for (int64_t i = 0; i < hidden; i++) v[i] = v[i] * inv * w[i];
        store_row(out, r * so, hidden, dtype, v);
    }
}

/* x: [T, H, D] with row stride sx and head stride sh (inner dim contiguous);
 * out: contiguous [T, H, D]; cos_sin: float32 [max_pos, D] (cos half, sin half).
 * Returns 0, or 1 + the index of the first position outside [0, max_pos). */
int64_t rotary_rows(const void *x, void *out, const int64_t *positions, const float *cos_sin,
                    int64_t tokens, int64_t heads, int64_t head_dim, int64_t sx, int64_t sh,
                    int64_t max_pos, int dtype, int num_threads) {
    for (int64_t t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_pos) return t + 1; /* nothing written */
    int64_t half = head_dim / 2;
    int threads = tokens * heads * head_dim >= 65536 ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const float *cs = cos_sin + positions[t] * head_dim;
        const float *cos = cs, *sin = cs + half;
        float in[1024], o[1024];
        for (int64_t h = 0; h < heads; h++) {
            load_row(x, t * sx + h * sh, head_dim, dtype, in);
            for (int64_t i = 0; i < half; i++) {
                float x1 = in[i], x2 = in[i + half];
                float a = x1 * cos[i], b = x2 * sin[i];
                float c = x2 * cos[i], d = x1 * sin[i];
                o[i] = a - b;
                o[i + half] = c + d;
            }
            store_row(out, (t * heads + h) * head_dim, head_dim, dtype, o);
        }
    }
    return 0;
}

/* exp(x) for float32, vectorisable: n = round(x / ln 2), r = x - n ln 2 (two
 * parts), a degree-6 Taylor polynomial on |r| <= 0.35 (relative error ~2e-7),
 * scaled by 2^n through the exponent bits. x is clamped to [-87, 88]. */
static inline float exp_approx(float x) {
    x = x > -87.0f ? x : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest (1.5 * 2^23) */
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

#if defined(__AVX2__)
/* exp_approx on 8 lanes, the same operations in the same order (no FMA), so
 * bit-equal to the scalar version. */
static inline __m256 exp_approx8(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(12582912.0f);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), shifter), shifter);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145751953125f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(1.428606765330187e-06f)));
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

/* g / (1 + exp(-g)) in place. Written with intrinsics on AVX2 because GCC
 * if-converts the scalar loop's clamp into a second, speculative division
 * whose unused lanes are subnormal: each such division then takes a
 * microcode assist, and those assists, not the arithmetic, set the loop's time. */
static void silu_inplace(float *restrict g, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = exp_approx8(_mm256_xor_ps(x, sign));
        _mm256_storeu_ps(g + i, _mm256_div_ps(x, _mm256_add_ps(one, e)));
    }
#endif
    for (; i < n; i++) g[i] = g[i] / (1.0f + exp_approx(-g[i]));
}

/* g / (1 + exp(-2u)), u = sqrt(2/pi) * (g + 0.044715 g^3), in place: GELU's
 * tanh form, 0.5 g (1 + tanh(u)), rewritten as g * sigmoid(2u) (the same
 * value, and no cancellation in 1 + tanh(u) where tanh(u) is near -1).
 * Vectorised as silu_inplace is, for the same reason. */
static void gelu_tanh_inplace(float *restrict g, int64_t n) {
    const float beta2 = 2.0f * 0.7978845608028654f, kappa = 0.044715f; /* 2 sqrt(2/pi) */
    int64_t i = 0;
#if defined(__AVX2__)
    const __m256 one = _mm256_set1_ps(1.0f), vb = _mm256_set1_ps(-beta2), vk = _mm256_set1_ps(kappa);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        __m256 inner = _mm256_add_ps(x, _mm256_mul_ps(vk, cube));
        __m256 e = exp_approx8(_mm256_mul_ps(vb, inner));
        _mm256_storeu_ps(g + i, _mm256_div_ps(x, _mm256_add_ps(one, e)));
    }
#endif
    for (; i < n; i++) {
        float x = g[i], inner = x + kappa * (x * x * x);
        g[i] = x / (1.0f + exp_approx(-beta2 * inner));
    }
}

/* act(gate) * up per row: x: [T, 2I] with row stride sx (gate, then up); out: [T, I] with row stride so.
 * bf16: the activation is rounded to bf16 before the product, as the reference's two ops do. */
static void act_and_mul_rows(const void *x, void *out, int64_t rows, int64_t inter, int64_t sx, int64_t so,
                             int dtype, int num_threads, void (*act)(float *restrict, int64_t)) {
    int threads = rows * inter >= 65536 ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float g[MAX_HIDDEN], u[MAX_HIDDEN];
        load_row(x, r * sx, inter, dtype, g);
        load_row(x, r * sx + inter, inter, dtype, u);
        act(g, inter);
        if (dtype)
            for (int64_t i = 0; i < inter; i++) g[i] = bf16_to_f32(f32_to_bf16(g[i])) * u[i];
        else
            for (int64_t i = 0; i < inter; i++) g[i] *= u[i];
        store_row(out, r * so, inter, dtype, g);
    }
}

/* SiLU-and-multiply (Llama's MLP). */
void silu_and_mul_rows(const void *x, void *out, int64_t rows, int64_t inter, int64_t sx, int64_t so,
                       int dtype, int num_threads) {
    act_and_mul_rows(x, out, rows, inter, sx, so, dtype, num_threads, silu_inplace);
}

/* GELU(tanh)-and-multiply (Gemma's MLP). */
void gelu_tanh_and_mul_rows(const void *x, void *out, int64_t rows, int64_t inter, int64_t sx, int64_t so,
                            int dtype, int num_threads) {
    act_and_mul_rows(x, out, rows, inter, sx, so, dtype, num_threads, gelu_tanh_inplace);
}

/* Copy each token's keys and values ([Hkv * D] elements of elem_size bytes,
 * rows sk / sv elements apart, heads contiguous) to its cache slot; slots < 0
 * (padding) are skipped and slots >= num_slots are reported, not written.
 * Returns the number of out-of-range slots (0 on success). */
int64_t store_kv_rows(const void *key, const void *value, void *k_cache, void *v_cache, const int64_t *slots,
                      int64_t tokens, int64_t row_elems, int64_t sk, int64_t sv, int64_t elem_size,
                      int64_t num_slots) {
    int64_t bad = 0;
    size_t row_bytes = (size_t)(row_elems * elem_size);
    for (int64_t t = 0; t < tokens; t++) {
        int64_t slot = slots[t];
        if (slot < 0) continue;
        if (slot >= num_slots) { bad++; continue; }
        memcpy((char *)k_cache + slot * row_bytes, (const char *)key + t * sk * elem_size, row_bytes);
        memcpy((char *)v_cache + slot * row_bytes, (const char *)value + t * sv * elem_size, row_bytes);
    }
    return bad;
}

/* The index of the first maximum of v[0..n) (of the first NaN if there is one), as torch.max(dim=-1).indices
 * gives it: one pass for the maximum, one for where it first is. For greedy sampling: PyTorch's max with
 * indices scans a 262,144-logit row in ~225 us on one thread, its value-only max in ~12 us. */
static int64_t argmax_row(const float *v, int64_t n) {
    float m = -INFINITY;
    int nan = 0;
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512 mv = _mm512_set1_ps(-INFINITY);
    __mmask16 bad = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 a = _mm512_loadu_ps(v + i);
        bad |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        mv = _mm512_max_ps(mv, a);
    }
    m = _mm512_reduce_max_ps(mv);
    nan = bad != 0;
#endif
    for (; i < n; i++) {
        if (v[i] != v[i])
            nan = 1;
        else if (v[i] > m)
            m = v[i];
    }
    i = 0;
    if (nan) {
        for (; i < n; i++)
            if (v[i] != v[i]) return i;
    }
#if defined(__AVX512F__)
    __m512 target = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i), target, _CMP_EQ_OQ);
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
#endif
    for (; i < n; i++)
        if (v[i] == m) return i;
    return 0;
}

/* out[r] = argmax_row(x + r * sx, n) for float32 rows; rows split across OpenMP threads. */
void argmax_rows(const float *x, int64_t rows, int64_t n, int64_t sx, int64_t *out, int num_threads) {
#pragma omp parallel for num_threads(rows > 1 ? num_threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * sx, n);
}
