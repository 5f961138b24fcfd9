// tightfit lite: a torch-free forward pass for llama-architecture GGUF models, over the file's
// own weights (Q4_0 / Q4_1 / Q8_0 / F16 / F32) read in place from the memory map; K/V in half
// floats (as llama.cpp's default f16 cache).
//
// One call computes n tokens, each with its own sequence id and position, so the same call is a
// prompt's prefill (n tokens of one sequence), a decode step of many sequences (one token each)
// or a mix. K/V of all n tokens are written before attention, so a prefill token attends to the
// tokens before it in the same call. Matrix rows are shared out with OpenMP inside one parallel
// region a call. Activations are quantised to int8 per 32 values (as ggml's Q8_1: scale and
// scaled sum), so a 4-bit dot product is integer multiply-adds (AVX-512 VNNI where the CPU has
// it, plain C otherwise) and one float multiply-add a block.
//
// Python side: tightfit/lite/runtime.py (builds this file with the system C compiler, loads it
// with ctypes, points it at the GGUF tensors).
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define TF_AVX2 1
#endif
#if defined(TF_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TF_VNNI 1
#endif
#if defined(TF_AVX2) || defined(__F16C__)
#include <immintrin.h>
#endif

#define QK 32
enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q8_0 = 8 };

typedef struct {
    int type, rows, cols;
    size_t row_bytes;
    const uint8_t *data;
} tensor;

typedef struct {
    const float *attn_norm, *ffn_norm;
    tensor wq, wk, wv, wo, wgate, wup, wdown;
} layer;

typedef struct {
    float d;  // scale
    float s;  // d * sum(q)
    int8_t q[QK];
} blockq8;

typedef struct {
    int n_layer, d_model, n_head, n_kv, head_dim, d_ff, vocab, n_ctx, n_seq;
    float eps, rope_base;
    tensor tok_embd, output;
    const float *out_norm;
    layer *layers;
    float *inv_freq;
    uint16_t *kv;  // half floats [seq][layer][k|v][n_ctx][n_kv * head_dim], touched as used
    size_t kv_elems;
} model;

// ---- half precision ----------------------------------------------------------------------

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            exp = 113;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static uint16_t f2h(float f) {  // round to nearest even
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff, e8 = (x >> 23) & 0xff;
    const int32_t exp = (int32_t)e8 - 127 + 15;
    if (e8 == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {  // subnormal half (or zero)
        if (exp < -10) return (uint16_t)sign;
        const uint32_t m = mant | 0x800000, shift = (uint32_t)(14 - exp), half = 1u << (shift - 1);
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;  // may carry into the exponent: right
    return (uint16_t)h;
}

static size_t row_bytes(int type, int cols) {
    switch (type) {
        case T_F32: return (size_t)cols * 4;
        case T_F16: return (size_t)cols * 2;
        case T_Q4_0: return (size_t)cols / QK * 18;
        case T_Q4_1: return (size_t)cols / QK * 20;
        case T_Q8_0: return (size_t)cols / QK * 34;
    }
    return 0;
}

// ---- activations -------------------------------------------------------------------------

static void quantize_row(const float *x, blockq8 *y, int k) {
    for (int b = 0; b < k / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.f;
#pragma omp simd reduction(max : amax)
        for (int j = 0; j < QK; j++) {
            const float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int q = (int)lrintf(xb[j] * id);
            y[b].q[j] = (int8_t)q;
            sum += q;
        }
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

// ---- dot products of one weight row with one quantised activation row ----------------------

#ifdef TF_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

static float dot_q4(const uint8_t *w, const blockq8 *x, int nb, int has_min) {
    const int bs = has_min ? 20 : 18;
    float extra = 0.f;
#ifdef TF_VNNI
    __m256 acc = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bs;
        const float d = h2f(blk);
        const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + bs - 16));
        const __m256i wq = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4),
                                            _mm_and_si128(raw, m4));
        const __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].q);
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, xq);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * x[b].d), acc);
        extra += (has_min ? h2f(blk + 2) : -8.f * d) * x[b].s;
    }
    return hsum8(acc) + extra;
#else
    float acc = 0.f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bs, *qs = blk + bs - 16;
        const float d = h2f(blk);
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += (qs[j] & 0x0F) * x[b].q[j] + (qs[j] >> 4) * x[b].q[j + 16];
        acc += (float)sum * d * x[b].d;
        extra += (has_min ? h2f(blk + 2) : -8.f * d) * x[b].s;
    }
    return acc + extra;
#endif
}

static float dot_q8_0(const uint8_t *w, const blockq8 *x, int nb) {
#ifdef TF_VNNI
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 34;
        const __m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 2));
        const __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].q);
        // unsigned |w| times x with w's sign: the signed product as VNNI's u8 x s8 wants it
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wq),
                                              _mm256_sign_epi8(xq, wq));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(blk) * x[b].d), acc);
    }
    return hsum8(acc);
#else
    float acc = 0.f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 34;
        const int8_t *qs = (const int8_t *)(blk + 2);
        int sum = 0;
        for (int j = 0; j < QK; j++) sum += qs[j] * x[b].q[j];
        acc += (float)sum * h2f(blk) * x[b].d;
    }
    return acc;
#endif
}

#ifdef TF_VNNI
// Four activation rows (x, x + xs, x + 2 xs, x + 3 xs blocks apart) against one weight row: each
// weight block is unpacked once for the four (prefill and batched decode are compute-bound).
static void dot4_q4(const uint8_t *w, const blockq8 *x, size_t xs, int nb, int has_min,
                    float *out) {
    const int bs = has_min ? 20 : 18;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    float e0 = 0.f, e1 = 0.f, e2 = 0.f, e3 = 0.f;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i z = _mm256_setzero_si256();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bs;
        const float d = h2f(blk), mn = has_min ? h2f(blk + 2) : -8.f * d;
        const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + bs - 16));
        const __m256i wq = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4),
                                            _mm_and_si128(raw, m4));
        const blockq8 *x0 = x + b, *x1 = x0 + xs, *x2 = x1 + xs, *x3 = x2 + xs;
#define TF_STEP(acc, e, xb)                                                                    \
    acc = _mm256_fmadd_ps(                                                                      \
        _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(z, wq, _mm256_loadu_si256((const __m256i *)xb->q))), \
        _mm256_set1_ps(d * xb->d), acc);                                                        \
    e += mn * xb->s;
        TF_STEP(acc0, e0, x0) TF_STEP(acc1, e1, x1) TF_STEP(acc2, e2, x2) TF_STEP(acc3, e3, x3)
#undef TF_STEP
    }
    out[0] = hsum8(acc0) + e0; out[1] = hsum8(acc1) + e1;
    out[2] = hsum8(acc2) + e2; out[3] = hsum8(acc3) + e3;
}

static void dot4_q8_0(const uint8_t *w, const blockq8 *x, size_t xs, int nb, float *out) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    const __m256i z = _mm256_setzero_si256();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * 34;
        const float d = h2f(blk);
        const __m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 2)), wa = _mm256_abs_epi8(wq);
        const blockq8 *x0 = x + b, *x1 = x0 + xs, *x2 = x1 + xs, *x3 = x2 + xs;
#define TF_STEP(acc, xb)                                                                       \
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(                              \
        z, wa, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xb->q), wq))),             \
        _mm256_set1_ps(d * xb->d), acc);
        TF_STEP(acc0, x0) TF_STEP(acc1, x1) TF_STEP(acc2, x2) TF_STEP(acc3, x3)
#undef TF_STEP
    }
    out[0] = hsum8(acc0); out[1] = hsum8(acc1); out[2] = hsum8(acc2); out[3] = hsum8(acc3);
}
#endif

#ifdef TF_AVX2
// Float weights (F32, or F16 widened with F16C): up to four activation rows (x, x + k, ...)
// against one weight row, each weight vector loaded (and widened) once for all of them. One
// row alone gets four accumulators, so the multiply-adds do not wait on each other. The scalar
// loop below it is a strict left-to-right sum the compiler may not reorder, ~2 GFLOP/s.
#define TF_LOAD8(w, j, f16) ((f16) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((w) + 2 * (j)))) \
                                   : _mm256_loadu_ps((const float *)(w) + (j)))
static void dotn_float(const tensor *t, int r, const float *x, int n, float *out) {
    const uint8_t *w = t->data + (size_t)r * t->row_bytes;
    const int k = t->cols, f16 = t->type == T_F16;
    int j = 0;
    if (n == 1) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (; j + 32 <= k; j += 32) {
            a0 = _mm256_fmadd_ps(TF_LOAD8(w, j, f16), _mm256_loadu_ps(x + j), a0);
            a1 = _mm256_fmadd_ps(TF_LOAD8(w, j + 8, f16), _mm256_loadu_ps(x + j + 8), a1);
            a2 = _mm256_fmadd_ps(TF_LOAD8(w, j + 16, f16), _mm256_loadu_ps(x + j + 16), a2);
            a3 = _mm256_fmadd_ps(TF_LOAD8(w, j + 24, f16), _mm256_loadu_ps(x + j + 24), a3);
        }
        for (; j + 8 <= k; j += 8)
            a0 = _mm256_fmadd_ps(TF_LOAD8(w, j, f16), _mm256_loadu_ps(x + j), a0);
        out[0] = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    } else {
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
        for (; j + 8 <= k; j += 8) {
            const __m256 wv = TF_LOAD8(w, j, f16);
            a[0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j), a[0]);
            a[1] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + k + j), a[1]);
            if (n > 2) a[2] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 2 * k + j), a[2]);
            if (n > 3) a[3] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 3 * k + j), a[3]);
        }
        for (int i = 0; i < n; i++) out[i] = hsum8(a[i]);
    }
    for (; j < k; j++) {  // a width that is not a multiple of 8
        const float wj = f16 ? h2f(w + 2 * j) : ((const float *)w)[j];
        for (int i = 0; i < n; i++) out[i] += wj * x[(size_t)i * k + j];
    }
}
#undef TF_LOAD8
#endif

static float dot_float(const tensor *t, int r, const float *x) {
#ifdef TF_AVX2
    float v;
    dotn_float(t, r, x, 1, &v);
    return v;
#else
    float acc = 0.f;
    if (t->type == T_F32) {
        const float *w = (const float *)(t->data + (size_t)r * t->row_bytes);
        for (int j = 0; j < t->cols; j++) acc += w[j] * x[j];
    } else {
        const uint8_t *w = t->data + (size_t)r * t->row_bytes;
        for (int j = 0; j < t->cols; j++) acc += h2f(w + 2 * j) * x[j];
    }
    return acc;
#endif
}

static inline float dot_row(const tensor *t, int r, const blockq8 *xq, const float *xf) {
    const uint8_t *w = t->data + (size_t)r * t->row_bytes;
    switch (t->type) {
        case T_Q4_0: return dot_q4(w, xq, t->cols / QK, 0);
        case T_Q4_1: return dot_q4(w, xq, t->cols / QK, 1);
        case T_Q8_0: return dot_q8_0(w, xq, t->cols / QK);
        default: return dot_float(t, r, xf);
    }
}

// y[t][r] (+)= W[r] . x[t] for the rows of up to three matrices sharing one input, split over
// the team's threads (call inside a parallel region). Each weight row is read once for all n
// tokens.
static void matmul(const tensor **ws, float **ys, int nw, const blockq8 *xq, const float *xf,
                   int n, int add) {
    int total = 0;
    for (int i = 0; i < nw; i++) total += ws[i]->rows;
    const int k = ws[0]->cols, nb = k / QK;
#pragma omp for schedule(static)
    for (int g = 0; g < total; g++) {
        int i = 0, r = g;
        while (r >= ws[i]->rows) r -= ws[i++]->rows;
        const tensor *w = ws[i];
        float *y = ys[i];
        const int ld = w->rows;
        int t = 0;
#ifdef TF_VNNI
        if (w->type == T_Q4_0 || w->type == T_Q4_1 || w->type == T_Q8_0) {
            const uint8_t *wr = w->data + (size_t)r * w->row_bytes;
            float v[4];
            for (; t + 4 <= n; t += 4) {
                if (w->type == T_Q8_0) dot4_q8_0(wr, xq + (size_t)t * nb, nb, nb, v);
                else dot4_q4(wr, xq + (size_t)t * nb, nb, nb, w->type == T_Q4_1, v);
                for (int j = 0; j < 4; j++) {
                    if (add) y[(size_t)(t + j) * ld + r] += v[j]; else y[(size_t)(t + j) * ld + r] = v[j];
                }
            }
        }
#endif
#ifdef TF_AVX2
        if (w->type == T_F32 || w->type == T_F16) {
            for (float v[4]; t < n; t += 4) {
                const int m = n - t < 4 ? n - t : 4;
                dotn_float(w, r, xf + (size_t)t * k, m, v);
                for (int j = 0; j < m; j++) {
                    if (add) y[(size_t)(t + j) * ld + r] += v[j]; else y[(size_t)(t + j) * ld + r] = v[j];
                }
            }
        }
#endif
        for (; t < n; t++) {
            const float v = dot_row(w, r, xq + (size_t)t * nb, xf + (size_t)t * k);
            if (add) y[(size_t)t * ld + r] += v; else y[(size_t)t * ld + r] = v;
        }
    }
}

static void dequant_row(const tensor *t, int r, float *out) {
    const uint8_t *w = t->data + (size_t)r * t->row_bytes;
    const int nb = t->cols / QK;
    switch (t->type) {
        case T_F32: memcpy(out, w, (size_t)t->cols * 4); return;
        case T_F16: for (int j = 0; j < t->cols; j++) out[j] = h2f(w + 2 * j); return;
        case T_Q8_0:
            for (int b = 0; b < nb; b++) {
                const float d = h2f(w + b * 34);
                for (int j = 0; j < QK; j++) out[b * QK + j] = d * (float)(int8_t)w[b * 34 + 2 + j];
            }
            return;
        default: {
            const int has_min = t->type == T_Q4_1, bs = has_min ? 20 : 18;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = w + (size_t)b * bs, *qs = blk + bs - 16;
                const float d = h2f(blk), m = has_min ? h2f(blk + 2) : -8.f * d;
                for (int j = 0; j < 16; j++) {
                    out[b * QK + j] = d * (float)(qs[j] & 0x0F) + m;
                    out[b * QK + j + 16] = d * (float)(qs[j] >> 4) + m;
                }
            }
        }
    }
}

// ---- attention over half-float K/V ------------------------------------------------------------

// e^x written so that the loops calling it vectorise (expf is a scalar libm call: ~40% of a
// long-context decode step was spent in it). Cephes' expf polynomial on x - n ln2, scaled by 2^n
// through the exponent bits; within ~2 ulp on [-87, 88], clamped outside. (The torch engine's
// kernels, engine/kernels/decode.cpp, carry the same function in C++.)
static inline float fast_exp(float x) {
    x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    const float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * z + r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

#define ATT_CHUNKS 8     // a token's positions are split into at most this many chunks
#define ATT_MIN_CHUNK 256 // ... of at least this many positions

static inline void h2f_row(const uint16_t *src, float *dst, int n) {
    int e = 0;
#ifdef TF_AVX2
    for (; e + 8 <= n; e += 8)
        _mm256_storeu_ps(dst + e, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + e))));
#endif
    for (; e < n; e++) dst[e] = h2f((const uint8_t *)(src + e));
}

static inline float dot_f(const float *a, const float *b, int n) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int e = 0; e < n; e++) s += a[e] * b[e];
    return s;
}

// A token's chunk size: depends on its own context length only, so its arithmetic is the same
// whatever else shares the call.
static inline int att_chunk(int len) {
    const int c = (len + ATT_CHUNKS - 1) / ATT_CHUNKS;
    return c > ATT_MIN_CHUNK ? c : ATT_MIN_CHUNK;
}

#ifdef TF_AVX2
// K rows are read at a stride of all KV heads' width (n_kv * head_dim halves), one head's slice
// each; perf put ~30% of a long-context step's attention on the loads' stalls. Asking for the row
// this many positions ahead halved attention's time at 1,536 positions (one-off timing, one
// thread: 8.0-8.4 -> 4.2-4.6 ms a step). A prefetch past the slot's end does not fault.
#ifndef TF_PREFETCH_ROWS
#define TF_PREFETCH_ROWS 8
#endif
// V rows [0, len) weighted by w[i * ch + j] into G outputs of hd floats, 8 values of every output
// at a time held in registers (G is a constant where this is inlined, so acc[] stays in ymm).
static inline __attribute__((always_inline)) void weigh_v(int G, const uint16_t *V, size_t kvd,
                                                          int len, int hd, const float *w, int ch,
                                                          float *out, size_t ostride) {
    for (int e = 0; e < hd; e += 8) {
        __m256 acc[8];
        for (int i = 0; i < G; i++) acc[i] = _mm256_setzero_ps();
        for (int j = 0; j < len; j++) {
            const __m256 v = _mm256_cvtph_ps(
                _mm_loadu_si128((const __m128i *)(V + (size_t)j * kvd + e)));
            for (int i = 0; i < G; i++)
                acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i * ch + j), v, acc[i]);
        }
        for (int i = 0; i < G; i++) _mm256_storeu_ps(out + (size_t)i * ostride + e, acc[i]);
    }
}

// Scores of K rows [0, len) against G query heads: each row widened from half once, two 8-wide
// partial sums per dot product and a tree at the end (an `omp simd` reduction ends in 16
// dependent scalar adds instead).
static inline __attribute__((always_inline)) void score_k(int G, const float *qg,
                                                          const uint16_t *K, size_t kvd, int len,
                                                          int hd, float scale, float *sc, int ch) {
    for (int j = 0; j < len; j++) {
        const uint16_t *kj = K + (size_t)j * kvd;
        _mm_prefetch((const char *)(kj + TF_PREFETCH_ROWS * kvd), _MM_HINT_T0);
        _mm_prefetch((const char *)(kj + TF_PREFETCH_ROWS * kvd) + 64, _MM_HINT_T0);
        __m256 a0[8], a1[8];
        for (int i = 0; i < G; i++) a0[i] = a1[i] = _mm256_setzero_ps();
        int e = 0;
        for (; e + 16 <= hd; e += 16) {
            const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kj + e)));
            const __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kj + e + 8)));
            for (int i = 0; i < G; i++) {
                a0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + (size_t)i * hd + e), k0, a0[i]);
                a1[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + (size_t)i * hd + e + 8), k1, a1[i]);
            }
        }
        for (; e < hd; e += 8) {
            const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kj + e)));
            for (int i = 0; i < G; i++)
                a0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + (size_t)i * hd + e), k0, a0[i]);
        }
        for (int i = 0; i < G; i++) sc[i * ch + j] = hsum8(_mm256_add_ps(a0[i], a1[i])) * scale;
    }
}
#endif

// Positions [lo, hi) of one token against one KV head, for the G query heads sharing it: each K
// and V row is read (and widened from half) once for all G. Per query head i, writes the chunk's
// max score, its sum of exp(score - max) and the unnormalised output (hd values) at
// part + i * pstride; the chunks are merged afterwards (as flash-decoding does).
static void attend_chunk(const float *qg, const uint16_t *K, const uint16_t *V, size_t kvd,
                         int lo, int hi, int G, int hd, float scale, float *sc, int ch,
                         float *row, float *part, size_t pstride) {
    const int len = hi - lo;
    K += (size_t)lo * kvd;
    V += (size_t)lo * kvd;
#ifdef TF_AVX2
    const int fast = hd % 8 == 0 && G >= 1 && G <= 8;
#else
    const int fast = 0;
#endif
    if (fast) {
#ifdef TF_AVX2
        switch (G) {  // one copy per group size, its loops over G unrolled
#define TF_CASE(g) case g: score_k(g, qg, K, kvd, len, hd, scale, sc, ch); break;
            TF_CASE(1) TF_CASE(2) TF_CASE(3) TF_CASE(4) TF_CASE(5) TF_CASE(6) TF_CASE(7)
            TF_CASE(8)
#undef TF_CASE
        }
#endif
    } else {
        for (int j = 0; j < len; j++) {
            h2f_row(K + (size_t)j * kvd, row, hd);
            for (int i = 0; i < G; i++) sc[i * ch + j] = dot_f(qg + (size_t)i * hd, row, hd) * scale;
        }
    }
    for (int i = 0; i < G; i++) {
        float *sci = sc + i * ch, mx = -INFINITY, sum = 0.f;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < len; j++) mx = sci[j] > mx ? sci[j] : mx;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < len; j++) {
            sci[j] = fast_exp(sci[j] - mx);
            sum += sci[j];
        }
        float *p = part + (size_t)i * pstride;
        p[0] = mx;
        p[1] = sum;
    }
    if (fast) {
#ifdef TF_AVX2
        switch (G) {
#define TF_CASE(g) case g: weigh_v(g, V, kvd, len, hd, sc, ch, part + 2, pstride); break;
            TF_CASE(1) TF_CASE(2) TF_CASE(3) TF_CASE(4) TF_CASE(5) TF_CASE(6) TF_CASE(7)
            TF_CASE(8)
#undef TF_CASE
        }
#endif
        return;
    }
    for (int i = 0; i < G; i++)
        for (int e = 0; e < hd; e++) part[(size_t)i * pstride + 2 + e] = 0.f;
    for (int j = 0; j < len; j++) {
        h2f_row(V + (size_t)j * kvd, row, hd);
        for (int i = 0; i < G; i++) {
            float *o = part + (size_t)i * pstride + 2;
            const float w = sc[i * ch + j];
            for (int e = 0; e < hd; e++) o[e] += w * row[e];
        }
    }
}

static inline void store_h(uint16_t *dst, const float *src, int n) {
    int e = 0;
#ifdef TF_AVX2
    for (; e + 8 <= n; e += 8)
        _mm_storeu_si128((__m128i *)(dst + e),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + e), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; e < n; e++) dst[e] = f2h(src[e]);
}

static void rms_norm(const float *x, const float *w, float *y, int d, float eps) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < d; j++) ss += x[j] * x[j];
    const float s = 1.f / sqrtf(ss / (float)d + eps);
    for (int j = 0; j < d; j++) y[j] = x[j] * s * w[j];
}

// ---- the model -----------------------------------------------------------------------------

static inline uint16_t *kv_at(const model *m, int seq, int l, int which, int pos) {
    const size_t kvd = (size_t)m->n_kv * m->head_dim;
    return m->kv + ((((size_t)seq * m->n_layer + l) * 2 + which) * m->n_ctx + pos) * kvd;
}

model *tf_model_new(const int *dims, const float *fparams) {
    model *m = calloc(1, sizeof(model));
    if (!m) return NULL;
    m->n_layer = dims[0]; m->d_model = dims[1]; m->n_head = dims[2]; m->n_kv = dims[3];
    m->head_dim = dims[4]; m->d_ff = dims[5]; m->vocab = dims[6]; m->n_ctx = dims[7];
    m->n_seq = dims[8];
    m->eps = fparams[0]; m->rope_base = fparams[1];
    m->layers = calloc((size_t)m->n_layer, sizeof(layer));
    m->inv_freq = malloc(sizeof(float) * (size_t)(m->head_dim / 2));
    m->kv_elems = (size_t)m->n_seq * m->n_layer * 2 * m->n_ctx * m->n_kv * m->head_dim;
    // address space only: pages become resident as positions are written, and a finished
    // sequence's pages are handed back (tf_seq_release)
    void *kv = mmap(NULL, m->kv_elems * sizeof(uint16_t), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    m->kv = kv == MAP_FAILED ? NULL : (uint16_t *)kv;
    if (!m->layers || !m->inv_freq || !m->kv) {
        free(m->layers); free(m->inv_freq);
        if (m->kv) munmap(m->kv, m->kv_elems * sizeof(uint16_t));
        free(m);
        return NULL;
    }
    for (int i = 0; i < m->head_dim / 2; i++)
        m->inv_freq[i] = powf(m->rope_base, -2.f * (float)i / (float)m->head_dim);
    return m;
}

void tf_model_free(model *m) {
    if (!m) return;
    munmap(m->kv, m->kv_elems * sizeof(uint16_t));
    free(m->layers); free(m->inv_freq); free(m);
}

// Returns a sequence slot's K/V pages to the system (whole pages inside the slot's range); the
// slot reads as zeros afterwards and is rewritten from position 0 by its next user.
void tf_seq_release(model *m, int seq) {
    if (seq < 0 || seq >= m->n_seq) return;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t per = (size_t)m->n_layer * 2 * m->n_ctx * m->n_kv * m->head_dim * sizeof(uint16_t);
    const uintptr_t lo = (uintptr_t)m->kv + (size_t)seq * per, hi = lo + per;
    const uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

// slot: 0 q, 1 k, 2 v, 3 o, 4 gate, 5 up, 6 down, 7 attn_norm, 8 ffn_norm (layer >= 0);
// with layer = -1: 0 token embedding, 1 output head, 2 output norm. Returns 0, or -1 when the
// type or shape is not usable.
int tf_set_tensor(model *m, int l, int slot, int type, int rows, int cols, const void *data) {
    if (l >= m->n_layer) return -1;
    if (slot >= 7 || (l < 0 && slot == 2)) {
        const float *p = (const float *)data;
        if (l < 0) m->out_norm = p;
        else if (slot == 7) m->layers[l].attn_norm = p;
        else m->layers[l].ffn_norm = p;
        return 0;
    }
    if (row_bytes(type, cols) == 0 || (type >= T_Q4_0 && cols % QK)) return -1;
    tensor t = {type, rows, cols, row_bytes(type, cols), (const uint8_t *)data};
    if (l < 0) {
        if (slot == 0) m->tok_embd = t; else m->output = t;
        return 0;
    }
    tensor *dst[] = {&m->layers[l].wq, &m->layers[l].wk, &m->layers[l].wv, &m->layers[l].wo,
                     &m->layers[l].wgate, &m->layers[l].wup, &m->layers[l].wdown};
    *dst[slot] = t;
    return 0;
}

size_t tf_kv_bytes_per_token(const model *m) {
    return (size_t)m->n_layer * 2 * m->n_kv * m->head_dim * sizeof(uint16_t);
}

// 2: AVX-512 VNNI dot products and AVX2/F16C attention; 1: AVX2/F16C attention only; 0: plain C
int tf_simd(void) {
#if defined(TF_VNNI)
    return 2;
#elif defined(TF_AVX2)
    return 1;
#else
    return 0;
#endif
}

// Runs n tokens; writes the logits of the tokens listed in out_rows (n_out of them) to
// logits[n_out][vocab]. Returns 0, or a negative code: -1 token id, -2 position, -3 sequence,
// -4 out of memory.
int tf_forward(model *m, int n, const int32_t *tokens, const int32_t *seqs, const int32_t *pos,
               int n_out, const int32_t *out_rows, float *logits, int threads) {
    const int D = m->d_model, H = m->n_head, KV = m->n_kv, hd = m->head_dim, F = m->d_ff;
    const int qd = H * hd, kvd = KV * hd, kmax = D > F ? (D > qd ? D : qd) : (F > qd ? F : qd);
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= m->tok_embd.rows) return -1;
        if (pos[t] < 0 || pos[t] >= m->n_ctx) return -2;
        if (seqs[t] < 0 || seqs[t] >= m->n_seq) return -3;
    }
    for (int i = 0; i < n_out; i++)
        if (out_rows[i] < 0 || out_rows[i] >= n) return -1;
    if (threads < 1) threads = 1;
    float *x = malloc(sizeof(float) * (size_t)n * D), *xn = malloc(sizeof(float) * (size_t)n * kmax);
    float *q = malloc(sizeof(float) * (size_t)n * qd), *k = malloc(sizeof(float) * (size_t)n * kvd);
    float *v = malloc(sizeof(float) * (size_t)n * kvd), *att = malloc(sizeof(float) * (size_t)n * qd);
    float *g = malloc(sizeof(float) * (size_t)n * F), *u = malloc(sizeof(float) * (size_t)n * F);
    int maxlen = 1;
    for (int t = 0; t < n; t++) maxlen = pos[t] + 1 > maxlen ? pos[t] + 1 : maxlen;
    const int group = H / KV, ch_max = att_chunk(maxlen);
    const size_t per_thread = (size_t)group * ch_max + hd;  // scores of a chunk + one K/V row
    float *scores = malloc(sizeof(float) * (size_t)threads * per_thread);
    float *part = malloc(sizeof(float) * (size_t)n * H * ATT_CHUNKS * (hd + 2));
    blockq8 *xq = malloc(sizeof(blockq8) * (size_t)n * (kmax / QK));
    int rc = 0;
    if (!x || !xn || !q || !k || !v || !att || !g || !u || !scores || !part || !xq) {
        rc = -4;
        goto done;
    }
    const float scale = 1.f / sqrtf((float)hd);

#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        float *sc = scores + (size_t)omp_get_thread_num() * per_thread;
#else
        float *sc = scores;
#endif
        float *row = sc + (size_t)group * ch_max;
#pragma omp for
        for (int t = 0; t < n; t++) dequant_row(&m->tok_embd, tokens[t], x + (size_t)t * D);

        for (int l = 0; l < m->n_layer; l++) {
            const layer *L = &m->layers[l];
#pragma omp for
            for (int t = 0; t < n; t++) {
                rms_norm(x + (size_t)t * D, L->attn_norm, xn + (size_t)t * D, D, m->eps);
                quantize_row(xn + (size_t)t * D, xq + (size_t)t * (D / QK), D);
            }
            {
                const tensor *ws[] = {&L->wq, &L->wk, &L->wv};
                float *ys[] = {q, k, v};
                matmul(ws, ys, 3, xq, xn, n, 0);
            }
            // rotary (adjacent pairs, as llama.cpp's llama GGUF layout wants) and the K/V write
#pragma omp for
            for (int t = 0; t < n; t++) {
                for (int i = 0; i < hd / 2; i++) {
                    const float a = (float)pos[t] * m->inv_freq[i], c = cosf(a), s = sinf(a);
                    for (int h = 0; h < H + KV; h++) {
                        float *p = h < H ? q + (size_t)t * qd + h * hd
                                         : k + (size_t)t * kvd + (h - H) * hd;
                        const float x0 = p[2 * i], x1 = p[2 * i + 1];
                        p[2 * i] = x0 * c - x1 * s;
                        p[2 * i + 1] = x0 * s + x1 * c;
                    }
                }
                store_h(kv_at(m, seqs[t], l, 0, pos[t]), k + (size_t)t * kvd, kvd);
                store_h(kv_at(m, seqs[t], l, 1, pos[t]), v + (size_t)t * kvd, kvd);
            }
            // (token, KV head, chunk) work items, taken dynamically: a causal prompt's later
            // tokens have more chunks, and one long decode spreads over every thread
#pragma omp for schedule(dynamic, 1)
            for (int w = 0; w < n * KV * ATT_CHUNKS; w++) {
                const int t = w / (KV * ATT_CHUNKS), gk = (w / ATT_CHUNKS) % KV;
                const int c = w % ATT_CHUNKS, len = pos[t] + 1, ch = att_chunk(len);
                const int lo = c * ch;
                if (lo >= len) continue;
                const int hi = lo + ch < len ? lo + ch : len;
                attend_chunk(q + (size_t)t * qd + (size_t)gk * group * hd,
                             kv_at(m, seqs[t], l, 0, 0) + (size_t)gk * hd,
                             kv_at(m, seqs[t], l, 1, 0) + (size_t)gk * hd, kvd, lo, hi, group,
                             hd, scale, sc, ch, row,
                             part + (((size_t)t * H + (size_t)gk * group) * ATT_CHUNKS + c) * (hd + 2),
                             (size_t)ATT_CHUNKS * (hd + 2));
            }
#pragma omp for collapse(2)
            for (int t = 0; t < n; t++) {
                for (int h = 0; h < H; h++) {  // merge the chunks by their maxima and sums
                    const int len = pos[t] + 1, ch = att_chunk(len), nc = (len + ch - 1) / ch;
                    const float *p = part + ((size_t)t * H + h) * ATT_CHUNKS * (hd + 2);
                    float mx = -INFINITY, sum = 0.f;
                    for (int c = 0; c < nc; c++) mx = p[c * (hd + 2)] > mx ? p[c * (hd + 2)] : mx;
                    float *o = att + (size_t)t * qd + (size_t)h * hd;
                    for (int e = 0; e < hd; e++) o[e] = 0.f;
                    for (int c = 0; c < nc; c++) {
                        const float *pc = p + (size_t)c * (hd + 2), f = fast_exp(pc[0] - mx);
                        sum += pc[1] * f;
                        for (int e = 0; e < hd; e++) o[e] += f * pc[2 + e];
                    }
                    const float inv = 1.f / sum;
                    for (int e = 0; e < hd; e++) o[e] *= inv;
                }
            }
#pragma omp for
            for (int t = 0; t < n; t++) quantize_row(att + (size_t)t * qd, xq + (size_t)t * (qd / QK), qd);
            {
                const tensor *ws[] = {&L->wo};
                float *ys[] = {x};
                matmul(ws, ys, 1, xq, att, n, 1);
            }
#pragma omp for
            for (int t = 0; t < n; t++) {
                rms_norm(x + (size_t)t * D, L->ffn_norm, xn + (size_t)t * D, D, m->eps);
                quantize_row(xn + (size_t)t * D, xq + (size_t)t * (D / QK), D);
            }
            {
                const tensor *ws[] = {&L->wgate, &L->wup};
                float *ys[] = {g, u};
                matmul(ws, ys, 2, xq, xn, n, 0);
            }
#pragma omp for
            for (int t = 0; t < n; t++) {
                float *gt = g + (size_t)t * F;
                const float *ut = u + (size_t)t * F;
#pragma omp simd
                for (int j = 0; j < F; j++) gt[j] = gt[j] / (1.f + fast_exp(-gt[j])) * ut[j];
                quantize_row(gt, xq + (size_t)t * (F / QK), F);
            }
            {
                const tensor *ws[] = {&L->wdown};
                float *ys[] = {x};
                matmul(ws, ys, 1, xq, g, n, 1);
            }
        }
#pragma omp for
        for (int i = 0; i < n_out; i++) {
            rms_norm(x + (size_t)out_rows[i] * D, m->out_norm, xn + (size_t)i * D, D, m->eps);
            quantize_row(xn + (size_t)i * D, xq + (size_t)i * (D / QK), D);
        }
        {
            const tensor *ws[] = {&m->output};
            float *ys[] = {logits};
            if (n_out > 0) matmul(ws, ys, 1, xq, xn, n_out, 0);
        }
    }
done:
    free(x); free(xn); free(q); free(k); free(v); free(att); free(g); free(u); free(scores);
    free(part);
    free(xq);
    return rc;
}

// y[n][rows] = x[n][cols] . W^T for one weight matrix as stored: the matmul of tf_forward on its
// own (activations quantised the same way), for testing the kernels against a reference.
int tf_linear(int type, int rows, int cols, const void *data, int n, const float *x, float *y,
              int threads) {
    if (row_bytes(type, cols) == 0 || (type >= T_Q4_0 && cols % QK) || n < 1) return -1;
    const tensor t = {type, rows, cols, row_bytes(type, cols), (const uint8_t *)data};
    blockq8 *xq = malloc(sizeof(blockq8) * (size_t)n * (size_t)(cols / QK + 1));
    if (!xq) return -4;
    if (type >= T_Q4_0)
        for (int i = 0; i < n; i++) quantize_row(x + (size_t)i * cols, xq + (size_t)i * (cols / QK), cols);
    const tensor *ws[] = {&t};
    float *ys[] = {y};
#pragma omp parallel num_threads(threads < 1 ? 1 : threads)
    matmul(ws, ys, 1, xq, x, n, 0);
    free(xq);
    return 0;
}
