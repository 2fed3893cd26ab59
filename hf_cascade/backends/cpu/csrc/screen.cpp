// The output head's argmax screen (hf_cascade/backends/cpu/argmax_screen.py): which outputs can still be a row's
// argmax (or among its k largest) given screen logits and their error bounds, and, where the CPU has AVX512-VNNI,
// an integer screen product. Compiled into the panel kernel's extension (panel_linear.cpp registers these).
//
// The integer product: the head's int8 copy q (one float32 scale a_j per output) times the row x quantized per
// group of G inputs, x~ = round(x / b_g) in [-127, 127] (b_g = max |x| over the group / 127). vpdpbusd multiplies
// unsigned by signed bytes, so the kernel reads u = x~ + 128 and subtracts 128 * (the group's sum of q_j): each
// group's dot product is then exact in int32 (at most 64 * 127 * 127 in magnitude, also exact in float32), the
// groups are summed in float32 with their b_g, and each sum is multiplied by a_j once. Against the widened-float
// product (panel_linear_i8) this is a quarter of the instructions per weight: the pass is bound by reading the
// int8 copy, not by arithmetic, for the few rows of a verification. Its error bound has a second term, from x's
// quantization (argmax_screen.py derives it).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

namespace {

typedef float vec16 __attribute__((vector_size(64)));
inline vec16 load16(const float* p) { vec16 v; std::memcpy(&v, p, sizeof(v)); return v; }

// -- candidates --------------------------------------------------------------------------------------------
//
// Per row i of the screen logits y [m, N], with reach_j = norm[i] * margin[j] (+ norm2[i] * margin2[j] where a
// second term is given), every j whose y_j + reach_j reaches the k-th largest y_j - reach_j. Three passes per
// row, vectorized by blocks of kScan outputs: (1) each block's largest lower bound; (2) the k-th largest of
// those, t, is at most the row's k-th largest lower bound (k blocks each hold one >= t), so only the outputs at
// or above t enter a heap of the k largest, whose smallest is the floor; (3) the outputs of the blocks whose
// largest upper bound reaches the floor are checked one by one. Rows are spread over the threads. Returns one
// int64 index tensor per row, ascending. (Each bound may be computed with or without a fused multiply-add: the
// margins' 1% rounding up covers that.)
constexpr int64_t kScan = 64;                   // outputs per block: four vectors

struct Reach {                                  // reach_j = r * c[j] + r2 * c2[j] (c2 may be null)
  const float* c; float r; const float* c2; float r2;
  float at(int64_t j) const { return r * c[j] + (c2 ? r2 * c2[j] : 0.0f); }
  vec16 at16(int64_t j) const {
    vec16 v = (vec16{} + r) * load16(c + j);
    if (c2) v += (vec16{} + r2) * load16(c2 + j);
    return v;
  }
};

inline float hmax(vec16 v) {
  float m = v[0];
  for (int i = 1; i < 16; ++i) m = std::max(m, v[i]);
  return m;
}

// the largest of y + sign * reach over [j0, j1) (sign -1: lower bounds, +1: upper bounds)
inline float block_max(const float* y, const Reach& R, float sign, int64_t j0, int64_t j1) {
  if (j1 - j0 == kScan) {
    vec16 acc = load16(y + j0) + sign * R.at16(j0);
    for (int64_t q = 16; q < kScan; q += 16) {
      const vec16 v = load16(y + j0 + q) + sign * R.at16(j0 + q);
      acc = v > acc ? v : acc;
    }
    return hmax(acc);
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = j0; j < j1; ++j) m = std::max(m, y[j] + sign * R.at(j));
  return m;
}

std::vector<int64_t> row_candidates(const float* y, const Reach& R, int64_t N, int64_t k) {
  const int64_t B = (N + kScan - 1) / kScan;
  std::vector<float> top(B);
  for (int64_t b = 0; b < B; ++b) top[b] = block_max(y, R, -1.0f, b * kScan, std::min(N, (b + 1) * kScan));
  float floor;
  if (k == 1) {
    floor = *std::max_element(top.begin(), top.end());
  } else {
    float t = -std::numeric_limits<float>::infinity();   // fewer blocks than k: every output enters the heap
    if (k <= B) {
      std::vector<float> order(top);
      std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), std::greater<float>());
      t = order[k - 1];
    }
    std::vector<float> heap;                    // min-heap of the k largest lower bounds >= t
    heap.reserve(k);
    for (int64_t b = 0; b < B; ++b) {
      if (top[b] < t) continue;
      for (int64_t j = b * kScan; j < std::min(N, (b + 1) * kScan); ++j) {
        const float low = y[j] - R.at(j);
        if (low < t) continue;
        if (static_cast<int64_t>(heap.size()) < k) {
          heap.push_back(low);
          std::push_heap(heap.begin(), heap.end(), std::greater<float>());
        } else if (low > heap.front()) {
          std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
          heap.back() = low;
          std::push_heap(heap.begin(), heap.end(), std::greater<float>());
        }
      }
    }
    floor = static_cast<int64_t>(heap.size()) < k ? t : heap.front();
  }
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t j0 = b * kScan, j1 = std::min(N, (b + 1) * kScan);
    if (block_max(y, R, 1.0f, j0, j1) < floor) continue;
    for (int64_t j = j0; j < j1; ++j)
      if (y[j] + R.at(j) >= floor) ids.push_back(j);
  }
  return ids;
}

void check_per(const torch::Tensor& t, int64_t n, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.numel() == n && t.is_contiguous(),
              "screen_candidates: one float32 ", what, " expected (", n, ")");
}

}  // namespace

std::vector<torch::Tensor> screen_candidates(const torch::Tensor& y, const torch::Tensor& norm,
                                             const torch::Tensor& margin, int64_t k,
                                             const c10::optional<torch::Tensor>& norm2,
                                             const c10::optional<torch::Tensor>& margin2) {
  TORCH_CHECK(y.dim() == 2 && y.scalar_type() == at::kFloat && y.is_contiguous(), "screen_candidates: y [m, N] float32");
  const int64_t M = y.size(0), N = y.size(1);
  check_per(norm, M, "norm per row");
  check_per(margin, N, "margin per output");
  TORCH_CHECK(norm2.has_value() == margin2.has_value(), "screen_candidates: norm2 and margin2 go together");
  if (norm2.has_value()) {
    check_per(*norm2, M, "second norm per row");
    check_per(*margin2, N, "second margin per output");
  }
  TORCH_CHECK(k >= 1 && N >= 1, "screen_candidates: k >= 1 and at least one output");
  k = std::min(k, N);
  std::vector<std::vector<int64_t>> picked(M);
  at::parallel_for(0, M, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      Reach R{margin.data_ptr<float>(), norm.data_ptr<float>()[i], nullptr, 0.0f};
      if (norm2.has_value()) {
        R.c2 = margin2->data_ptr<float>();
        R.r2 = norm2->data_ptr<float>()[i];
      }
      picked[i] = row_candidates(y.data_ptr<float>() + i * N, R, N, k);
    }
  });
  std::vector<torch::Tensor> out;
  for (auto& ids : picked) {
    auto t = torch::empty({static_cast<int64_t>(ids.size())}, torch::kLong);
    std::copy(ids.begin(), ids.end(), t.data_ptr<int64_t>());
    out.push_back(t);
  }
  return out;
}

// -- the integer product (AVX512-VNNI) ----------------------------------------------------------------------
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
namespace {

constexpr int kVnniRows = 8;                    // rows of x per pass over a panel: 8 + 8 accumulators
constexpr int64_t kVnniBlock = 16;              // panels per cache block when x has more rows

struct VnniArgs {
  const uint8_t* u; int64_t Kp;                 // x~ + 128, [m, Kp]
  const float* xs; int64_t G, group4;           // b_g, [m, G]; quads of inputs per group
  const int8_t* q; const int32_t* qsum;         // [P, Kp / 4, 64]; [P, G, 16]
  const float* scale; float* y; int64_t N;      // [P * 16]; [m, N]
};

// Rows m0 .. m0 + MC of y, outputs of panels p .. p + NP: NP panels at once, so that each row has NP independent
// accumulation chains and NP weight streams are read together (one chain for one row waits on vpdpbusd's latency).
template <int MC, int NP>
void vnni_panels(const VnniArgs& A, int64_t m0, int64_t p) {
  const int64_t K4 = A.Kp / 4;
  __m512 f[NP][MC];
  for (int c = 0; c < NP; ++c)
    for (int r = 0; r < MC; ++r) f[c][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < A.G; ++g) {
    __m512i a[NP][MC];
    for (int c = 0; c < NP; ++c)
      for (int r = 0; r < MC; ++r) a[c][r] = _mm512_setzero_si512();
    for (int64_t t = g * A.group4; t < (g + 1) * A.group4; ++t) {
      __m512i x[MC];
      for (int r = 0; r < MC; ++r) {
        int32_t quad;
        std::memcpy(&quad, A.u + (m0 + r) * A.Kp + 4 * t, 4);
        x[r] = _mm512_set1_epi32(quad);
      }
      for (int c = 0; c < NP; ++c) {
        const __m512i w = _mm512_loadu_si512(A.q + ((p + c) * K4 + t) * 64);
        for (int r = 0; r < MC; ++r) a[c][r] = _mm512_dpbusd_epi32(a[c][r], x[r], w);
      }
    }
    for (int c = 0; c < NP; ++c) {
      const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(A.qsum + ((p + c) * A.G + g) * 16), 7);  // 128 sum q
      for (int r = 0; r < MC; ++r)
        f[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a[c][r], offset)),
                                  _mm512_set1_ps(A.xs[(m0 + r) * A.G + g]), f[c][r]);
    }
  }
  for (int c = 0; c < NP; ++c) {
    const __m512 s = _mm512_loadu_ps(A.scale + (p + c) * 16);
    const int64_t n = std::min<int64_t>(16, A.N - (p + c) * 16);
    const __mmask16 keep = n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
    for (int r = 0; r < MC; ++r)
      _mm512_mask_storeu_ps(A.y + (m0 + r) * A.N + (p + c) * 16, keep, _mm512_mul_ps(f[c][r], s));
  }
}

// Panels at once per number of rows: about 16 accumulators (int32 and float32) in the 32 registers.
constexpr int panels_at_once(int rows) { return rows <= 2 ? 4 : (rows <= 4 ? 2 : 1); }

using VnniBlock = void (*)(const VnniArgs&, int64_t, int64_t);
template <int MC> constexpr VnniBlock kFull = vnni_panels<MC, panels_at_once(MC)>;
constexpr VnniBlock kVnni[kVnniRows] = {kFull<1>, kFull<2>, kFull<3>, kFull<4>, kFull<5>, kFull<6>, kFull<7>, kFull<8>};
constexpr VnniBlock kVnniOne[kVnniRows] = {vnni_panels<1, 1>, vnni_panels<2, 1>, vnni_panels<3, 1>, vnni_panels<4, 1>,
                                           vnni_panels<5, 1>, vnni_panels<6, 1>, vnni_panels<7, 1>, vnni_panels<8, 1>};

}  // namespace

// u [m, Kp] uint8 (x~ + 128), xs [m, G] float32 (b_g), q [P, Kp / 4, 64] int8 (four inputs of each of a panel's 16
// outputs per 64 bytes), qsum [P, G, 16] int32 (each group's sum of q per output), scale [P * 16] -> y [m, N] float32.
torch::Tensor panel_screen_vnni(const torch::Tensor& u, const torch::Tensor& xs, const torch::Tensor& q,
                                const torch::Tensor& qsum, const torch::Tensor& scale, int64_t N, int64_t group) {
  TORCH_CHECK(u.dim() == 2 && u.scalar_type() == at::kByte && u.is_contiguous(), "panel_screen_vnni: u [m, Kp] uint8");
  const int64_t M = u.size(0), Kp = u.size(1), P = (N + 15) / 16;
  TORCH_CHECK(group > 0 && group % 4 == 0 && Kp % group == 0, "panel_screen_vnni: groups of a multiple of 4 inputs tiling Kp");
  const int64_t G = Kp / group;
  TORCH_CHECK(xs.scalar_type() == at::kFloat && xs.is_contiguous() && xs.numel() == M * G, "panel_screen_vnni: xs [m, G] float32");
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous() && q.dim() == 3 && q.size(0) == P &&
              q.size(1) == Kp / 4 && q.size(2) == 64, "panel_screen_vnni: q [P, Kp / 4, 64] int8");
  TORCH_CHECK(qsum.scalar_type() == at::kInt && qsum.is_contiguous() && qsum.numel() == P * G * 16,
              "panel_screen_vnni: qsum [P, G, 16] int32");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == P * 16,
              "panel_screen_vnni: one float32 scale per padded output");
  auto y = torch::empty({M, N}, torch::kFloat);
  const VnniArgs A{u.data_ptr<uint8_t>(), Kp, xs.data_ptr<float>(), G, group / 4, q.data_ptr<int8_t>(),
                   qsum.data_ptr<int32_t>(), scale.data_ptr<float>(), y.data_ptr<float>(), N};
  // One chunk of rows: one pass over this thread's panels. More: every chunk over each block of kVnniBlock
  // panels while it is in cache (160 KiB for Gemma-3-270M's head), so the copy still streams from memory once.
  at::parallel_for(0, P, kVnniBlock, [&](int64_t b0, int64_t b1) {
    const int64_t step = M <= kVnniRows ? b1 - b0 : kVnniBlock;
    for (int64_t q0 = b0; q0 < b1; q0 += step) {
      const int64_t q1 = std::min(b1, q0 + step);
      for (int64_t m0 = 0; m0 < M; m0 += kVnniRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kVnniRows, M - m0));
        const int64_t np = panels_at_once(rows);
        int64_t p = q0;
        for (; p + np <= q1; p += np) kVnni[rows - 1](A, m0, p);
        for (; p < q1; ++p) kVnniOne[rows - 1](A, m0, p);
      }
    }
  });
  return y;
}
#endif

// The int8 panels of pack_panels_i8 ([P, K, 16]) in the integer product's layout: [P, Kp / 4, 64] (four inputs of
// each of a panel's 16 outputs per 64 bytes: byte 4 r + i of block t is input 4 t + i of output r; inputs past K are
// zero, Kp a multiple of the group) and each group's sum of q per output, [P, Kp / group, 16] int32.
std::vector<torch::Tensor> pack_vnni(const torch::Tensor& panels, int64_t group) {
  TORCH_CHECK(panels.scalar_type() == at::kChar && panels.is_contiguous() && panels.dim() == 3 && panels.size(2) == 16 &&
              group > 0 && group % 4 == 0, "pack_vnni: expected int8 panels [P, K, 16] and a group that is a multiple of 4");
  const int64_t P = panels.size(0), K = panels.size(1), Kp = (K + group - 1) / group * group, G = Kp / group;
  auto vnni = torch::zeros({P, Kp / 4, 64}, panels.options());
  auto qsum = torch::zeros({P, G, 16}, panels.options().dtype(at::kInt));
  const int8_t* src = panels.data_ptr<int8_t>();
  int8_t* dst = vnni.data_ptr<int8_t>();
  int32_t* sums = qsum.data_ptr<int32_t>();
  at::parallel_for(0, P, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t r = 0; r < 16; ++r) {
          const int8_t v = src[(p * K + k) * 16 + r];
          dst[(p * (Kp / 4) + k / 4) * 64 + 4 * r + k % 4] = v;
          sums[(p * G + k / group) * 16 + r] += v;
        }
  });
  return {vnni, qsum};
}

void register_screen(pybind11::module& m) {
  m.def("pack_vnni", &pack_vnni, "int8 panels [P, K, 16], group -> (the integer product's layout [P, Kp / 4, 64], "
        "each group's sum of q [P, Kp / group, 16] int32)");
  m.def("screen_candidates", &screen_candidates,
        "per row of y [m, N]: the outputs whose upper bound reaches the k-th largest lower bound",
        pybind11::arg("y"), pybind11::arg("norm"), pybind11::arg("margin"), pybind11::arg("k"),
        pybind11::arg("norm2") = pybind11::none(), pybind11::arg("margin2") = pybind11::none());
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
  m.def("panel_screen_vnni", &panel_screen_vnni,
        "(x~ + 128) [m, Kp] uint8 with group scales [m, G] @ (scale * q).T in VNNI panels -> [m, N]");
#endif
}
