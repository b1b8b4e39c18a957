/*
 * elementwise.c: the decoder's small per-row steps (target_model/native.py composes a layer from them): RMS
 * normalisation of whole rows or of each head (QK-norm), rotary position embedding in place (rotate-half, partial
 * rotary included), copying key/value rows into the cache, SiLU(gate) * up, GeLU-tanh(gate) * up and soft-capping
 * cap * tanh(x / cap). Each row is computed alone, on the calling thread (soft-capping a long call: pieces on the
 * pool). GeLU-tanh and soft-capping give every element the same bits on every path and wherever it sits (see
 * "elementwise functions" below); attention.c soft-caps its scores with them.
 * Not here: the matmuls and attention, and the checks of shapes and pointers (../_cpu.c, kernels/__init__.py).
 */
#include "kernels.h"

/* ------------------------------------------------------------------------------ the decoder's per-row steps */

/* out = weight * (x / sqrt(mean(x^2) + eps)) per row (Hugging Face's RMSNorm in float32). */
void cpu_rms_norm(const float *x, long rows, long dim, long x_stride, const float *weight, float eps, float *out,
                  long out_stride)
{
    for (long r = 0; r < rows; r++) {
        const float *v = x + r * x_stride;
        float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail = 0.0f;
        long i = 0;
        for (; i + 8 <= dim; i += 8)
            for (int j = 0; j < 8; j++)
                lanes[j] += v[i + j] * v[i + j];
        for (; i < dim; i++)
            tail += v[i] * v[i];
        float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        float inverse = 1.0f / sqrtf((sum + tail) / (float)dim + eps);
        float *o = out + r * out_stride;
        for (i = 0; i < dim; i++)
            o[i] = weight[i] * (v[i] * inverse);
    }
}

/* In place, for `heads` heads of head_dim at base + r * row_stride: x[i] = a cos - b sin, x[i + half] = b cos + a sin
 * with a = x[i], b = x[i + half] for i < half (rotate-half; half < head_dim / 2 leaves the rest of each head as it is:
 * a partial rotary), cos/sin rows [positions][half] at each row's position. */
void cpu_rope(float *base, long rows, long row_stride, long heads, long head_dim, long half,
              const int32_t *positions, const float *cos_table, const float *sin_table)
{
    for (long r = 0; r < rows; r++) {
        const float *c = cos_table + (long)positions[r] * half, *s = sin_table + (long)positions[r] * half;
        for (long h = 0; h < heads; h++) {
            float *x = base + r * row_stride + h * head_dim;
            for (long i = 0; i < half; i++) {
                float a = x[i], b = x[i + half];
                x[i] = a * c[i] + (-b) * s[i];
                x[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/* Rows of `heads` x dim (at src + r * row_stride) into a cache laid out [head][position][dim] from `start`, as they
 * are (float32) or rounded to bfloat16 (`bf16`: a cache of half the bytes, which attention reads as they are). */
void cpu_store_rows(const float *src, long rows, long row_stride, long heads, long dim, void *dst,
                    long head_stride, long pos_stride, long start, int bf16)
{
    for (long r = 0; r < rows; r++)
        for (long h = 0; h < heads; h++) {
            const float *from = src + r * row_stride + h * dim;
            long at = h * head_stride + (start + r) * pos_stride;
            if (!bf16) {
                memcpy((float *)dst + at, from, sizeof(float) * (size_t)dim);
                continue;
            }
            uint16_t *to = (uint16_t *)dst + at;
            for (long d = 0; d < dim; d++) { /* rounded to the nearest, ties to even; a NaN stays a (quiet) NaN */
                uint32_t bits;
                memcpy(&bits, from + d, sizeof bits);
                if ((bits & 0x7fffffffu) > 0x7f800000u)
                    to[d] = (uint16_t)((bits >> 16) | 0x0040u);
                else
                    to[d] = (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
            }
        }
}

/* In place: RMSNorm of each of `heads` heads of head_dim at x + r * row_stride (QK-norm), every row in one call;
 * each head as cpu_rms_norm computes it. */
void cpu_rms_norm_heads(float *x, long rows, long row_stride, long heads, long head_dim, const float *weight,
                        float eps)
{
    for (long r = 0; r < rows; r++) {
        float *row = x + r * row_stride;
        cpu_rms_norm(row, heads, head_dim, head_dim, weight, eps, row, head_dim);
    }
}

static void silu_mul_portable(const float *gate, const float *up, long count, float *out)
{
    for (long i = 0; i < count; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* --------------------------------------------------------- elementwise functions: one formula on every path */

/* e^x, tanh and the two steps built on them (GeLU-tanh gating, soft-capping) give every element the same bits
 * wherever it sits and on every path: the scalar functions (the portable path) and the 8-lane AVX2 ones (every
 * x86 vector path) run the same IEEE operations in the same order (fmaf is the fused multiply-add vfmadd computes,
 * rintf the round-to-nearest-even of _mm256_round_ps, min/max written as minps/maxps compare), and the vector
 * loops take their tail through the same code on a masked load. Accuracy is that of Cephes' expf and tanhf
 * (about 1 ulp; 2-3 ulp after the steps around them). NaN stays NaN. */

#define EXP_HI 88.0f
#define EXP_LO -87.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f /* ln 2 = C1 - C2, C1 with few bits so that n * C1 is exact */
#define EXP_C2 -2.12194440e-4f
#define TANH_SMALL 0.625f /* below: tanh(a) = a + a^3 P(a^2); above: 1 - 2 / (e^(2a) + 1) */
/* GeLU-tanh: 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3); torch's float constants */
#define GELU_KAPPA 0.044715f
#define GELU_MINUS_2BETA (-2.0f * (float)(M_SQRT2 * M_2_SQRTPI * 0.5))

static inline float exp_scalar(float x)
{
    x = EXP_HI < x ? EXP_HI : x; /* minps(88, x): a NaN passes */
    x = EXP_LO > x ? EXP_LO : x;
    float n = rintf(x * EXP_LOG2E);
    float r = fmaf(-n, EXP_C1, x);
    r = fmaf(-n, EXP_C2, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float y = fmaf(p, r * r, r) + 1.0f;
    uint32_t bits = (uint32_t)((n == n ? (int32_t)n : 0) + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

static inline float tanh_scalar(float y)
{
    float a = fabsf(y), z = a * a;
    float p = -5.70498872745e-3f;
    p = fmaf(p, z, 2.06390887954e-2f);
    p = fmaf(p, z, -5.37397155531e-2f);
    p = fmaf(p, z, 1.33314422036e-1f);
    p = fmaf(p, z, -3.33332819422e-1f);
    float small = fmaf(p * z, a, a);
    float big = 1.0f - 2.0f / (exp_scalar(a + a) + 1.0f);
    return copysignf(a < TANH_SMALL ? small : big, y);
}

static inline float gelu_tanh_scalar(float x)
{
    float cube = x * x * x;
    return x / (1.0f + exp_scalar(GELU_MINUS_2BETA * (x + GELU_KAPPA * cube)));
}

/* out[i] = GeLU-tanh(gate[i]) * up[i] for i < count. */
static void gelu_tanh_mul_portable(const float *gate, const float *up, long count, float *out)
{
    for (long i = 0; i < count; i++)
        out[i] = gelu_tanh_scalar(gate[i]) * up[i];
}

/* x = cap * tanh(x / cap) in place. */
void cpu_soft_cap_portable(float *x, long count, float cap)
{
    for (long i = 0; i < count; i++)
        x[i] = tanh_scalar(x[i] / cap) * cap;
}

#if HAVE_X86
AVX2 static inline __m256 exp8_exact(__m256 x)
{
    x = _mm256_min_ps(_mm256_set1_ps(EXP_HI), x);
    x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C1), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C2), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i n32 = _mm256_cvtps_epi32(n); /* a NaN's lanes: any exponent, y is NaN there */
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(n32, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

AVX2 static inline __m256 tanh8(__m256 y)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, y), z = _mm256_mul_ps(a, a);
    __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), a, a);
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp8_exact(_mm256_add_ps(a, a));
    __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(TANH_SMALL), _CMP_LT_OQ));
    return _mm256_or_ps(t, _mm256_and_ps(sign, y)); /* t >= 0 or NaN: copysign */
}

AVX2 static inline __m256 gelu_tanh8(__m256 x)
{
    __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 inner = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(GELU_KAPPA), cube));
    __m256 e = exp8_exact(_mm256_mul_ps(_mm256_set1_ps(GELU_MINUS_2BETA), inner));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* Lanes 0 .. count-1 (count < 8) on, the rest off: the tail of a loop, loaded and stored through the same code. */
AVX2 static inline __m256i tail_mask(long count)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AVX2 static void gelu_tanh_mul_avx2(const float *gate, const float *up, long count, float *out)
{
    long i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu_tanh8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
    if (i < count) {
        __m256i mask = tail_mask(count - i);
        __m256 value = _mm256_mul_ps(gelu_tanh8(_mm256_maskload_ps(gate + i, mask)), _mm256_maskload_ps(up + i, mask));
        _mm256_maskstore_ps(out + i, mask, value);
    }
}

AVX2 void cpu_soft_cap_avx2(float *x, long count, float cap)
{
    const __m256 c = _mm256_set1_ps(cap);
    long i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(tanh8(_mm256_div_ps(_mm256_loadu_ps(x + i), c)), c));
    if (i < count) {
        __m256i mask = tail_mask(count - i);
        _mm256_maskstore_ps(x + i, mask, _mm256_mul_ps(tanh8(_mm256_div_ps(_mm256_maskload_ps(x + i, mask), c)), c));
    }
}

/* e^x for any x (clamped to [-87, 88], where float32 neither overflows nor goes subnormal). */
AVX2 static inline __m256 exp8_any(__m256 x)
{
    return exp8(_mm256_min_ps(x, _mm256_set1_ps(88.0f)));
}

AVX2 static void silu_mul_avx2(const float *gate, const float *up, long count, float *out)
{
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    long i = 0;
    for (; i + 8 <= count; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 denominator = _mm256_add_ps(one, exp8_any(_mm256_sub_ps(zero, g)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, denominator), _mm256_loadu_ps(up + i)));
    }
    for (; i < count; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
#else /* no vector path on this CPU: the path is always ISA_PORTABLE (the AVX2 names stand for the portable loops) */
#define silu_mul_avx2 silu_mul_portable
#define gelu_tanh_mul_avx2 gelu_tanh_mul_portable
#define cpu_soft_cap_avx2 cpu_soft_cap_portable
#endif

/* Soft-capping a block's logits (rows x a vocabulary) on the pool, in pieces of SOFT_CAP_ITEM elements: each
 * element is computed alone, so the split changes nothing. */
#define SOFT_CAP_ITEM 16384

typedef struct {
    float *x;
    long count;
    float cap;
    int avx2;
} SoftCapTask;

static void soft_cap_items(const void *arg, long start, long stop)
{
    const SoftCapTask *t = arg;
    long i0 = start * SOFT_CAP_ITEM, i1 = stop * SOFT_CAP_ITEM < t->count ? stop * SOFT_CAP_ITEM : t->count;
    if (t->avx2)
        cpu_soft_cap_avx2(t->x + i0, i1 - i0, t->cap);
    else
        cpu_soft_cap_portable(t->x + i0, i1 - i0, t->cap);
}

/* x = cap * tanh(x / cap) in place, count >= 1 elements, cap > 0. */
void cpu_soft_cap(int path, float *x, long count, float cap)
{
    SoftCapTask t = {x, count, cap, path >= ISA_AVX2};
    cpu_run_parallel(soft_cap_items, &t, (count + SOFT_CAP_ITEM - 1) / SOFT_CAP_ITEM);
}

/* The gated activations of a block of rows: a row per work item, so each row runs the same code wherever it goes;
 * one row stays on the calling thread (its few thousand elements cost less than waking the pool), a block of
 * verified rows is split over the pool (8 rows of a 1.5B's 8960-wide MLP: 1.2 ms of a forward on one thread). */
typedef struct {
    const float *gate_up;
    long ffn;
    float *out;
    int avx2, gelu;
} GatedTask;

static void gated_rows(const void *arg, long start, long stop)
{
    const GatedTask *t = arg;
    for (long r = start; r < stop; r++) {
        const float *gate = t->gate_up + r * 2 * t->ffn, *up = gate + t->ffn;
        float *out = t->out + r * t->ffn;
        if (t->gelu && t->avx2)
            gelu_tanh_mul_avx2(gate, up, t->ffn, out);
        else if (t->gelu)
            gelu_tanh_mul_portable(gate, up, t->ffn, out);
        else if (t->avx2)
            silu_mul_avx2(gate, up, t->ffn, out);
        else
            silu_mul_portable(gate, up, t->ffn, out);
    }
}

/* out[r] = SiLU(gate) * up for each row r of gate_up [rows][2 * ffn] (gate, then up). */
void cpu_silu_mul(int path, const float *gate_up, long rows, long ffn, float *out)
{
    GatedTask t = {gate_up, ffn, out, path >= ISA_AVX2, 0};
    cpu_run_parallel(gated_rows, &t, rows);
}

/* out[r] = GeLU-tanh(gate) * up for each row r of gate_up [rows][2 * ffn] (gate, then up). */
void cpu_gelu_tanh_mul(int path, const float *gate_up, long rows, long ffn, float *out)
{
    GatedTask t = {gate_up, ffn, out, path >= ISA_AVX2, 1};
    cpu_run_parallel(gated_rows, &t, rows);
}
