// Fused CPU kernels for decode steps (tightfit/engine/kernels/__init__.py builds and loads this
// file; engine/scripted.py calls the ops from TorchScript as torch.ops.tightfit.*).
//
// Why: with 4-bit weights a decode step of the default model spent ~100 us a layer in ~40 small
// ATen ops (norms, rotary, casts, KV write and block gather, SDPA) around ~144 us of matmuls.
// Each op here replaces a run of them with one pass over the data:
//   rms_norm_to      x -> rms_norm(x) * w, written as fp32 or bf16 (the next matmul's input)
//   residual_norm    x + [post_norm](h), then rms_norm of the sum (next projection's input)
//   rope_write_kv    split fused qkv, [q/k norm], rotary on q and k, K/V into their cache slots
//   decode_attention one query per row over its paged K/V (no gather copy), sliding window
//   gated_act        silu(gate) * up (or gelu-tanh), written as the down projection's input
//   int8x2_split     the two int8 GEMM rows per input row of quant.linear.int8x2_linear
//   int8x2_combine   ... and their results joined again (the ~15 ATen ops around each int8
//                    matmul cost more than fbgemm's GEMM itself at decode sizes)
// Arithmetic follows the eager ops term for term (same formulas, fp32 accumulation); only the
// order of reductions differs, so results agree to float rounding, not bit for bit.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using at::Tensor;
using c10::BFloat16;

// One row of fp32 values from a row of fp32 or bf16.
inline void load_row(const Tensor& t, int64_t row, int64_t n, float* out) {
  if (t.scalar_type() == at::kFloat) {
    const float* p = t.data_ptr<float>() + row * t.stride(0);
    std::copy(p, p + n, out);
  } else {
    const BFloat16* p = t.data_ptr<BFloat16>() + row * t.stride(0);
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
  }
}

// n fp32 values into t (fp32 or bf16) from element `offset` on.
inline void store_at(Tensor& t, int64_t offset, int64_t n, const float* v) {
  if (t.scalar_type() == at::kFloat) {
    std::copy(v, v + n, t.data_ptr<float>() + offset);
  } else {
    BFloat16* p = t.data_ptr<BFloat16>() + offset;
    for (int64_t i = 0; i < n; ++i) p[i] = BFloat16(v[i]);  // round to nearest even
  }
}

inline void store_row(Tensor& t, int64_t row, int64_t n, const float* v) {
  store_at(t, row * t.stride(0), n, v);
}

// Dot product with 2 x 8 partial sums and a tree at the end (GCC/Clang vector extensions:
// whatever SIMD width the build targets). A `#pragma omp simd` reduction ends in 16 dependent
// scalar adds, which made a 64-wide dot ~4x slower than its multiplies.
typedef float vf8 __attribute__((vector_size(32)));

inline vf8 load8(const float* p) {
  vf8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float dot(const float* a, const float* b, int64_t n) {
  vf8 acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 += load8(a + i) * load8(b + i);
    acc1 += load8(a + i + 8) * load8(b + i + 8);
  }
  for (; i + 8 <= n; i += 8) acc0 += load8(a + i) * load8(b + i);
  const vf8 acc = acc0 + acc1;
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// rms_norm as layers.rms_norm: w * (x * rsqrt(mean(x^2) + eps)).
inline void norm_inplace(float* x, int64_t n, const float* w, double eps) {
  const float ss = dot(x, x, n);
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) x[i] = w[i] * (x[i] * r);
}

void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " is on ", t.device(), ": these kernels are CPU only");
}

void check_rows(const Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D, got ", t.dim(), " dims");
  TORCH_CHECK(t.stride(1) == 1, name, " rows must be contiguous");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16");
}

Tensor rms_norm_to(const Tensor& x, const Tensor& w, double eps, bool bf16) {
  check_rows(x, "x");
  const int64_t t = x.size(0), n = x.size(1);
  Tensor wc = w.contiguous().to(at::kFloat);
  TORCH_CHECK(wc.numel() == n, "norm weight has ", wc.numel(), " values for rows of ", n);
  Tensor out = at::empty({t, n}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  std::vector<float> buf(n);
  for (int64_t r = 0; r < t; ++r) {
    load_row(x, r, n, buf.data());
    norm_inplace(buf.data(), n, wc.data_ptr<float>(), eps);
    store_row(out, r, n, buf.data());
  }
  return out;
}

// x_new = x + (post_w ? rms_norm(h, post_w) : h); normed = rms_norm(x_new, w).
std::tuple<Tensor, Tensor> residual_norm(const Tensor& x, const Tensor& h,
                                         const c10::optional<Tensor>& post_w, const Tensor& w,
                                         double eps, bool bf16) {
  check_rows(x, "x");
  check_rows(h, "h");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x (the residual stream) must be float32");
  const int64_t t = x.size(0), n = x.size(1);
  TORCH_CHECK(h.size(0) == t && h.size(1) == n, "h ", h.sizes(), " does not match x ", x.sizes());
  Tensor wc = w.contiguous().to(at::kFloat);
  Tensor pw;
  if (post_w.has_value() && post_w->defined()) pw = post_w->contiguous().to(at::kFloat);
  Tensor x_new = at::empty({t, n}, x.options());
  Tensor out = at::empty({t, n}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  std::vector<float> hb(n);
  for (int64_t r = 0; r < t; ++r) {
    load_row(h, r, n, hb.data());
    if (pw.defined()) norm_inplace(hb.data(), n, pw.data_ptr<float>(), eps);
    const float* xr = x.data_ptr<float>() + r * x.stride(0);
    float* xn = x_new.data_ptr<float>() + r * n;
    for (int64_t i = 0; i < n; ++i) xn[i] = xr[i] + hb[i];
    std::copy(xn, xn + n, hb.data());
    norm_inplace(hb.data(), n, wc.data_ptr<float>(), eps);
    store_row(out, r, n, hb.data());
  }
  return {x_new, out};
}

// qkv [T, (H + 2 Hkv) D] -> q [T, H, D] fp32 (rotated); rotated k and v written to the caches
// [num_blocks, block_size, Hkv, D] at flat slots `slots` [T]. cos / sin_signed [T, 1, D]:
// x * cos + roll(x, D/2) * sin_signed, as layers.apply_rotary.
Tensor rope_write_kv(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                     const Tensor& slots, Tensor k_cache, Tensor v_cache, int64_t n_heads,
                     int64_t n_kv, const c10::optional<Tensor>& q_norm,
                     const c10::optional<Tensor>& k_norm, double eps) {
  check_rows(qkv, "qkv");
  check_cpu(k_cache, "k_cache");
  check_cpu(v_cache, "v_cache");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat,
              "K/V caches must be contiguous float32");
  const int64_t t = qkv.size(0), d = k_cache.size(-1), half = d / 2;
  TORCH_CHECK(k_cache.size(-2) == n_kv, "cache has ", k_cache.size(-2), " KV heads, not ", n_kv);
  TORCH_CHECK(qkv.size(1) == (n_heads + 2 * n_kv) * d, "qkv has ", qkv.size(1),
              " columns for ", n_heads, "+2x", n_kv, " heads of ", d);
  Tensor c = cos.reshape({t, d}).contiguous().to(at::kFloat);
  Tensor s = sin.reshape({t, d}).contiguous().to(at::kFloat);
  Tensor sl = slots.contiguous().to(at::kLong);
  TORCH_CHECK(sl.numel() == t, "slot_mapping has ", sl.numel(), " entries for ", t, " tokens");
  const int64_t n_slots = k_cache.numel() / (n_kv * d);
  for (int64_t r = 0; r < t; ++r) {  // all checked before anything is written
    const int64_t slot = sl.data_ptr<int64_t>()[r];
    TORCH_CHECK(slot >= 0 && slot < n_slots, "slot ", slot, " outside the cache of ", n_slots);
  }
  Tensor qn, kn;
  if (q_norm.has_value() && q_norm->defined()) qn = q_norm->contiguous().to(at::kFloat);
  if (k_norm.has_value() && k_norm->defined()) kn = k_norm->contiguous().to(at::kFloat);
  Tensor q = at::empty({t, n_heads, d}, qkv.options().dtype(at::kFloat));
  const int64_t width = qkv.size(1);
  std::vector<float> row(width);
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  for (int64_t r = 0; r < t; ++r) {
    load_row(qkv, r, width, row.data());
    const float* cr = c.data_ptr<float>() + r * d;
    const float* sr = s.data_ptr<float>() + r * d;
    const int64_t slot = sl.data_ptr<int64_t>()[r];
    for (int64_t h = 0; h < n_heads + n_kv; ++h) {
      float* x = row.data() + h * d;
      const bool is_q = h < n_heads;
      const Tensor& nw = is_q ? qn : kn;
      if (nw.defined()) norm_inplace(x, d, nw.data_ptr<float>(), eps);
      float* dst = is_q ? q.data_ptr<float>() + (r * n_heads + h) * d
                        : kc + (slot * n_kv + (h - n_heads)) * d;
      for (int64_t i = 0; i < d; ++i) {  // x is the row buffer, never dst
        const float rolled = x[i < half ? i + half : i - half];
        dst[i] = x[i] * cr[i] + rolled * sr[i];
      }
    }
    const float* v = row.data() + (n_heads + n_kv) * d;
    std::copy(v, v + n_kv * d, vc + slot * n_kv * d);
  }
  return q;
}

// e^x written so the compiler vectorises the loops that call it (std::exp is a scalar libm
// call). Cephes' expf polynomial on x - n ln2, scaled by 2^n through the exponent bits; within
// ~2 ulp on [-87, 88], clamped outside (softmax weights below e^-87 and sigmoid's tails).
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
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
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// One query per row over its own paged K/V: row r of group g reads the first positions[r] + 1
// slots of blocks[g][r - starts[g]] (the last `window` of them when window > 0), GQA by head
// groups. q [T, H, D] fp32 -> [T, H * D] in fp32 or bf16 (the output projection's input).
// Work is split into tasks of (row, chunk of <= kChunk positions); chunks of one row are merged
// by their running max and sum (as flash-decoding does), so a single long sequence uses every
// thread.
constexpr int64_t kChunk = 128;

Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& positions, at::IntArrayRef starts, at::TensorList blocks,
                        int64_t window, double scale, bool bf16) {
  check_cpu(q, "q");
  check_cpu(k_cache, "k_cache");
  check_cpu(v_cache, "v_cache");
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kFloat,
              "q must be contiguous float32 [T, H, D]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat,
              "K/V caches must be contiguous float32");
  TORCH_CHECK(starts.size() == blocks.size(), starts.size(), " group starts for ",
              blocks.size(), " block tables");
  const int64_t t = q.size(0), n_heads = q.size(1), d = q.size(2);
  const int64_t bs = k_cache.size(1), n_kv = k_cache.size(2), n_blocks = k_cache.size(0);
  TORCH_CHECK(n_heads % n_kv == 0, n_heads, " heads for ", n_kv, " KV heads");
  const int64_t rep = n_heads / n_kv;
  Tensor pos = positions.contiguous().to(at::kLong);
  TORCH_CHECK(pos.numel() == t, "positions has ", pos.numel(), " entries for ", t, " queries");
  // Per row: its block table row (pointer, length).
  std::vector<Tensor> tables;
  std::vector<const int64_t*> row_blocks(t, nullptr);
  std::vector<int64_t> row_nb(t, 0);
  for (size_t g = 0; g < blocks.size(); ++g) {
    tables.push_back(blocks[g].contiguous().to(at::kLong));
    const Tensor& tb = tables.back();
    TORCH_CHECK(tb.dim() == 2, "block table ", g, " must be [B, nb]");
    for (int64_t b = 0; b < tb.size(0); ++b) {
      const int64_t r = starts[g] + b;
      TORCH_CHECK(r >= 0 && r < t, "group ", g, " row ", b, " outside ", t, " queries");
      row_blocks[r] = tb.data_ptr<int64_t>() + b * tb.size(1);
      row_nb[r] = tb.size(1);
    }
  }
  // Tasks: (row, chunk of <= kChunk positions), all heads: each position's K (then V) row of
  // all KV heads is one contiguous read, which the prefetcher follows (reading one KV head's
  // slice of every position, strided, ran at ~7 GB/s).
  struct Task {
    int64_t r, lo, hi;
  };
  std::vector<Task> tasks;
  std::vector<int64_t> first_task(t + 1);  // tasks of row r: [first_task[r], first_task[r+1])
  int64_t work = 0;
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t r = 0; r < t; ++r) {
    TORCH_CHECK(row_blocks[r] != nullptr, "query ", r, " belongs to no group");
    const int64_t len = pp[r] + 1;
    TORCH_CHECK(len >= 1 && len <= row_nb[r] * bs, "query ", r, " at position ", len - 1,
                " beyond its ", row_nb[r], " blocks");
    for (int64_t j = 0; j < (len + bs - 1) / bs; ++j)
      TORCH_CHECK(row_blocks[r][j] >= 0 && row_blocks[r][j] < n_blocks, "block id ",
                  row_blocks[r][j], " outside the cache of ", n_blocks);
    const int64_t lo = window > 0 ? std::max<int64_t>(0, len - window) : 0;
    first_task[r] = static_cast<int64_t>(tasks.size());
    for (int64_t c = lo; c < len; c += kChunk) tasks.push_back({r, c, std::min(len, c + kChunk)});
    work += (len - lo) * n_kv;
  }
  first_task[t] = static_cast<int64_t>(tasks.size());
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  // Per task and query head: running max, sum of exp, and the unnormalised output row.
  std::vector<float> part_m(n_tasks * n_heads), part_s(n_tasks * n_heads);
  std::vector<float> part_o(n_tasks * n_heads * d);
  const float* qp = q.data_ptr<float>();
  const float* kc = k_cache.data_ptr<float>();
  const float* vc = v_cache.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t row_stride = n_kv * d;  // one position, all KV heads
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t ti = begin; ti < end; ++ti) {
      const Task& tk = tasks[ti];
      const int64_t n = tk.hi - tk.lo;
      scores.resize(n_heads * n);
      const int64_t* tb = row_blocks[tk.r];
      const float* qr = qp + tk.r * n_heads * d;
      // slot of position p: block tb[p / bs], offset p % bs (walked, not divided: an integer
      // division per position was a visible share of the time)
      int64_t blk = tk.lo / bs, off = tk.lo % bs;
      for (int64_t j = 0; j < n; ++j) {
        const float* k = kc + (tb[blk] * bs + off) * row_stride;
        for (int64_t g = 0, h = 0; g < n_kv; ++g)
          for (int64_t e = 0; e < rep; ++e, ++h)
            scores[h * n + j] = dot(qr + h * d, k + g * d, d) * sc;
        if (++off == bs) off = 0, ++blk;
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* sh = scores.data() + h * n;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) m = std::max(m, sh[j]);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; ++j) {
          sh[j] = fast_exp(sh[j] - m);
          sum += sh[j];
        }
        part_m[ti * n_heads + h] = m;
        part_s[ti * n_heads + h] = sum;
      }
      float* acc = part_o.data() + ti * n_heads * d;
      std::fill(acc, acc + n_heads * d, 0.f);
      blk = tk.lo / bs, off = tk.lo % bs;
      for (int64_t j = 0; j < n; ++j) {
        const float* v = vc + (tb[blk] * bs + off) * row_stride;
        for (int64_t g = 0, h = 0; g < n_kv; ++g) {
          const float* vh = v + g * d;
          for (int64_t e = 0; e < rep; ++e, ++h) {
            const float w = scores[h * n + j];
            float* a = acc + h * d;
#pragma omp simd
            for (int64_t i = 0; i < d; ++i) a[i] += w * vh[i];
          }
        }
        if (++off == bs) off = 0, ++blk;
      }
    }
  };
  if (work * d < (1 << 14)) {
    run(0, n_tasks);  // a few short rows: threads would cost more than they save
  } else {
    at::parallel_for(0, n_tasks, 1, run);
  }
  // Merge the chunks of each row (one chunk: a plain normalisation).
  Tensor out = at::empty({t, n_heads * d}, q.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  std::vector<float> o(d);
  for (int64_t r = 0; r < t; ++r) {
    const int64_t c0 = first_task[r], c1 = first_task[r + 1];
    for (int64_t h = 0; h < n_heads; ++h) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t c = c0; c < c1; ++c) m = std::max(m, part_m[c * n_heads + h]);
      float sum = 0.f;
      std::fill(o.begin(), o.end(), 0.f);
      for (int64_t c = c0; c < c1; ++c) {
        const float f = c1 - c0 == 1 ? 1.f : std::exp(part_m[c * n_heads + h] - m);
        sum += part_s[c * n_heads + h] * f;
        const float* a = part_o.data() + (c * n_heads + h) * d;
        for (int64_t i = 0; i < d; ++i) o[i] += a[i] * f;
      }
      const float inv = 1.f / sum;
      for (int64_t i = 0; i < d; ++i) o[i] *= inv;
      store_at(out, (r * n_heads + h) * d, d, o.data());
    }
  }
  return out;
}

// gu [T, 2 I] = [gate | up] -> act(gate) * up, act = silu or gelu (tanh approximation).
Tensor gated_act(const Tensor& gu, int64_t inter, bool gelu, bool bf16) {
  check_rows(gu, "gate_up");
  const int64_t t = gu.size(0);
  TORCH_CHECK(gu.size(1) == 2 * inter, "gate_up has ", gu.size(1), " columns, not 2 x ", inter);
  Tensor out = at::empty({t, inter}, gu.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  std::vector<float> row(2 * inter);
  const float beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
  for (int64_t r = 0; r < t; ++r) {
    load_row(gu, r, 2 * inter, row.data());
    float* g = row.data();
    const float* u = row.data() + inter;
    if (gelu) {  // 0.5 x (1 + tanh(y)) = x sigmoid(2y) (no cancellation in the tails)
#pragma omp simd
      for (int64_t i = 0; i < inter; ++i) {
        const float x = g[i];
        const float y = beta * (x + kappa * x * x * x);
        g[i] = x / (1.f + fast_exp(-2.f * y)) * u[i];
      }
    } else {
#pragma omp simd
      for (int64_t i = 0; i < inter; ++i) g[i] = g[i] / (1.f + fast_exp(-g[i])) * u[i];
    }
    store_row(out, r, inter, g);
  }
  return out;
}

// At least this many elements per thread when int8x2_split / int8x2_combine share out rows: a
// decode step's few rows run inline, a prefill chunk's go to all threads.
constexpr int64_t kRowGrainElems = 1 << 15;

// int8x2_linear's activation split (quant/linear.py, same formulas in the same order): per row
// a = max|x|; xn = x / a; hi = clamp(round(xn * half), +-top) / half; lo = xn - hi;
// b = max|lo| * (half / top); z = [hi rows; lo / b rows] with the +1 / -1 anchor columns.
// Returns z [2m, k+2], a [m, 1] and a*b [m, 1].
std::tuple<Tensor, Tensor, Tensor> int8x2_split(const Tensor& x, double levels) {
  check_rows(x, "x");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be float32");
  const int64_t m = x.size(0), k = x.size(1);
  const float half = static_cast<float>(levels / 2.0);
  const float top = static_cast<float>(static_cast<int64_t>(levels / 2.0));
  const float widen = static_cast<float>((levels / 2.0) / static_cast<double>(top));
  Tensor z = at::empty({2 * m, k + 2}, x.options());
  Tensor a = at::empty({m, 1}, x.options());
  Tensor ab = at::empty({m, 1}, x.options());
  float* zp = z.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* ap = a.data_ptr<float>();
  float* abp = ab.data_ptr<float>();
  const int64_t xs = x.stride(0);
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * xs;
      float* hi = zp + r * (k + 2);
      float* lo = zp + (m + r) * (k + 2);
      float amax = 0.f;
#pragma omp simd reduction(max : amax)
      for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(xr[i]));
      const float ar = std::max(amax, 1e-30f);
      float lmax = 0.f;
#pragma omp simd reduction(max : lmax)
      for (int64_t i = 0; i < k; ++i) {
        const float xn = xr[i] / ar;
        const float h = std::min(std::max(std::nearbyint(xn * half), -top), top) / half;
        hi[i] = h;
        lo[i] = xn - h;
        lmax = std::max(lmax, std::fabs(xn - h));
      }
      const float b = std::max(lmax, 1e-30f) * widen;
#pragma omp simd
      for (int64_t i = 0; i < k; ++i) lo[i] = lo[i] / b;
      hi[k] = lo[k] = 1.f;
      hi[k + 1] = lo[k + 1] = -1.f;
      ap[r] = ar;
      abp[r] = ar * b;
    }
  };
  at::parallel_for(0, m, std::max<int64_t>(1, kRowGrainElems / std::max<int64_t>(k, 1)), rows);
  return {z, a, ab};
}

// y [2m, n] (the GEMM of int8x2_split's rows) -> y[:m] * a + y[m:] * ab, [m, n], as
// torch.addcmul(y[:m] * a, y[m:], ab) computes it on CPU (one fused multiply-add onto the
// rounded first product), so the result is bit-identical to the plain stack's.
Tensor int8x2_combine(const Tensor& y, const Tensor& a, const Tensor& ab) {
  check_rows(y, "y");
  TORCH_CHECK(y.scalar_type() == at::kFloat, "y must be float32");
  const int64_t m = y.size(0) / 2, n = y.size(1);
  TORCH_CHECK(y.size(0) == 2 * m && a.numel() == m && ab.numel() == m,
              "y has ", y.size(0), " rows for ", a.numel(), " inputs (need twice as many)");
  Tensor ac = a.contiguous(), abc = ab.contiguous();
  Tensor out = at::empty({m, n}, y.options());
  const float* yp = y.data_ptr<float>();
  const float* acp = ac.data_ptr<float>();
  const float* abcp = abc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ys = y.stride(0);
  at::parallel_for(0, m, std::max<int64_t>(1, kRowGrainElems / std::max<int64_t>(n, 1)),
                   [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* yh = yp + r * ys;
      const float* yl = yp + (m + r) * ys;
      const float ar = acp[r], abr = abcp[r];
      float* o = op + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = std::fma(yl[i], abr, yh[i] * ar);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(tightfit, m) {
  m.def("rms_norm_to(Tensor x, Tensor w, float eps, bool bf16) -> Tensor", &rms_norm_to);
  m.def("residual_norm(Tensor x, Tensor h, Tensor? post_w, Tensor w, float eps, bool bf16)"
        " -> (Tensor, Tensor)",
        &residual_norm);
  m.def("rope_write_kv(Tensor qkv, Tensor cos, Tensor sin, Tensor slots, Tensor(a!) k_cache,"
        " Tensor(b!) v_cache, int n_heads, int n_kv, Tensor? q_norm, Tensor? k_norm, float eps)"
        " -> Tensor",
        &rope_write_kv);
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor positions,"
        " int[] starts, Tensor[] blocks, int window, float scale, bool bf16) -> Tensor",
        &decode_attention);
  m.def("gated_act(Tensor gu, int inter, bool gelu, bool bf16) -> Tensor", &gated_act);
  m.def("int8x2_split(Tensor x, float levels) -> (Tensor, Tensor, Tensor)", &int8x2_split);
  m.def("int8x2_combine(Tensor y, Tensor a, Tensor ab) -> Tensor", &int8x2_combine);
}
