// Few-row products with a weight stored in panels: y = x @ W.T for x [m, K], W [N, K].
//
// Built just in time by hf_cascade/panel.py (torch.utils.cpp_extension, -O3 -march=native -fopenmp).
//
// Why: verifying k draft tokens multiplies k + 1 rows by every weight of the target. The weights do
// not fit in cache, so the product costs one pass over W as long as the arithmetic keeps up; BLAS
// kernels tuned for large matrices stop keeping up at a few rows (Gemma-3-270M's 126 decoder linears,
// 2 threads, AVX-512: 16.7 ms for 3 rows, 22 ms for 4, 29 ms for 8). Here W is copied once into
// panels of 16 output rows, [ceil(N / 16), K, 16]: a panel is one contiguous stream, and each of its
// 16-float rows is multiplied by one broadcast x[m, k] for every m, so no horizontal sums are needed
// and every weight element is read once per 8 rows of x (6 without AVX-512). More rows go 8 (6) at a time
// over each block of 4 panels while it is in cache, so the weight still streams from memory once (a full
// pass per 8 rows made Gemma-3-270M's head cost 43 / 41 ms for 9 / 10 rows against 22-30 for 8; now 25 / 25).
//
// Vectors are GCC/Clang vector extensions: a panel row of 16 floats is one AVX-512 register where the CPU
// has them, two 8-float vectors elsewhere (two AVX2 registers, or four NEON ones). Each output is one
// sequential sum over k with fused multiply-adds (another accumulation order than BLAS: results differ by
// rounding only).
//
// The same panels in int8 with one scale per output row (pack_panels_i8, panel_linear_i8) are the output head's
// argmax screen (hf_cascade/backends/cpu/argmax_screen.py): a quarter of the bytes per pass, an error bound
// instead of exact products.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kPanel = 16;   // output rows per panel
// The products' vector (vecw) is one register: with AVX-512 a whole panel row (16 floats), elsewhere half of
// one (8 floats: an AVX2 register), a panel row being two of them. A 16-float vector on AVX2 is two registers
// that the compiler moves through memory in these loops, and accumulators beyond the register file spill
// (32 AVX-512 registers, 16 AVX2 ones): either made the AVX2 build slower than torch's products even for one
// row (docs/cpu-kernels.md, machines B without AVX-512 and D).
#if defined(__AVX512F__)
constexpr int kHalves = 1;
constexpr int kMaxRows = 8;      // rows of x per pass over the weight
#else
constexpr int kHalves = 2;
constexpr int kMaxRows = 6;
#endif
constexpr int kLanes = kPanel / kHalves;

typedef float vecw __attribute__((vector_size(kLanes * 4)));

inline vecw loadw(const float* p) { vecw v; std::memcpy(&v, p, sizeof(v)); return v; }
// kLanes int8 values widened to float32 (exact).
// (Intrinsics where the compiler would otherwise widen byte by byte.)
inline vecw loadw(const int8_t* p) {
  vecw v;
#if defined(__AVX512F__)
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  std::memcpy(&v, &f, sizeof(v));
#elif defined(__AVX2__)
  const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  std::memcpy(&v, &f, sizeof(v));
#else
  typedef int8_t i8xw __attribute__((vector_size(kLanes)));
  i8xw h; std::memcpy(&h, p, sizeof(h));
  v = __builtin_convertvector(h, vecw);
#endif
  return v;
}
inline void storew(float* p, vecw v) { std::memcpy(p, &v, sizeof(v)); }

// Panels [p0, p1) for M rows: xt [K, M] (x transposed), panels [P, K, 16], y [M, ldy] (columns n0..).
// NR panels at once: NR * kHalves * M accumulators, each weight vector used for M products.
// scale: nullptr, or one float per output row (padded to whole panels) multiplying each sum as it is stored.
template <int M, int NR, typename W>
void panels_block(const float* xt, const W* panels, const float* scale, float* y, int64_t ldy, int64_t K,
                  int64_t N, int64_t p0, int64_t p1) {
  constexpr int V = NR * kHalves;                 // weight vectors per k: half h of panel r is vector r * kHalves + h
  int64_t p = p0;
  for (; p + NR <= p1; p += NR) {
    vecw acc[V][M];
    for (int v = 0; v < V; ++v)
      for (int m = 0; m < M; ++m) acc[v][m] = vecw{};
    const W* w = panels + p * K * kPanel;
    for (int64_t k = 0; k < K; ++k) {
      vecw wk[V];
      for (int v = 0; v < V; ++v) wk[v] = loadw(w + ((v / kHalves) * K + k) * kPanel + (v % kHalves) * kLanes);
      for (int m = 0; m < M; ++m) {
        const vecw xb = vecw{} + xt[k * M + m];
        for (int v = 0; v < V; ++v) acc[v][m] += wk[v] * xb;
      }
    }
    for (int v = 0; v < V; ++v) {
      const int64_t n = (p + v / kHalves) * kPanel + (v % kHalves) * kLanes;
      if (scale != nullptr) {
        const vecw s = loadw(scale + n);
        for (int m = 0; m < M; ++m) acc[v][m] *= s;
      }
      for (int m = 0; m < M; ++m) {
        if (n + kLanes <= N) {
          storew(y + m * ldy + n, acc[v][m]);
        } else {
          for (int64_t i = 0; n + i < N; ++i) y[m * ldy + n + i] = acc[v][m][i];
        }
      }
    }
  }
  if constexpr (NR > 1) {
    if (p < p1) panels_block<M, 1, W>(xt, panels, scale, y, ldy, K, N, p, p1);
  }
}

// NR: panels per pass, so that the weight vectors, the accumulators and x's broadcast fit the registers:
// AVX-512 NR * (M + 1) + 1 <= 32; AVX2 2 NR (M + 1) + 1 <= 16.
template <int M, typename W>
void rows_block(const float* xt, const W* panels, const float* scale, float* y, int64_t ldy, int64_t K,
                int64_t N, int64_t p0, int64_t p1) {
  constexpr int NR = kHalves == 1 ? (M <= 2 ? 4 : (M <= 4 ? 3 : 2))
                                  : (M == 1 ? 3 : (M == 2 ? 2 : 1));
  panels_block<M, NR, W>(xt, panels, scale, y, ldy, K, N, p0, p1);
}

template <typename W>
using Block = void (*)(const float*, const W*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
#if defined(__AVX512F__)
template <typename W>
constexpr Block<W> kBlocks[kMaxRows] = {rows_block<1, W>, rows_block<2, W>, rows_block<3, W>, rows_block<4, W>,
                                        rows_block<5, W>, rows_block<6, W>, rows_block<7, W>, rows_block<8, W>};
#else
template <typename W>
constexpr Block<W> kBlocks[kMaxRows] = {rows_block<1, W>, rows_block<2, W>, rows_block<3, W>, rows_block<4, W>,
                                        rows_block<5, W>, rows_block<6, W>};
#endif

// Panels per cache block when x has more than kMaxRows rows: 4 panels of a 2048-wide weight are 512 KiB,
// which stay in a core's L2 while every kMaxRows-row chunk of x is multiplied by them.
constexpr int64_t kBlockPanels = 4;

}  // namespace

// W [N, K] -> panels [ceil(N / 16), K, 16] (output rows past N are zero).
torch::Tensor pack_panels(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "pack_panels: expected a 2-D float32 CPU weight, got ", weight.sizes(), " ", weight.scalar_type());
  const int64_t N = weight.size(0), K = weight.size(1), P = (N + kPanel - 1) / kPanel;
  auto padded = torch::zeros({P * kPanel, K}, weight.options());
  padded.narrow(0, 0, N).copy_(weight);
  return padded.view({P, kPanel, K}).transpose(1, 2).contiguous();
}

namespace {

// y [m, N] = x [m, K] @ W.T for W in panels of element type W (float, or int8 widened as loaded and scaled per row).
template <typename W>
torch::Tensor panels_product(const torch::Tensor& x, const W* w, int64_t N, const float* scale = nullptr) {
  const int64_t M = x.size(0), K = x.size(1);
  auto y = torch::empty({M, N}, x.options());
  std::vector<torch::Tensor> xts;                      // x transposed, [K, mc], per chunk of <= kMaxRows rows
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRows)
    xts.push_back(x.narrow(0, m0, std::min<int64_t>(kMaxRows, M - m0)).t().contiguous());
  float* out = y.data_ptr<float>();
  const int64_t P = (N + kPanel - 1) / kPanel;
  at::parallel_for(0, P, kBlockPanels, [&](int64_t b0, int64_t b1) {
    // one chunk: one pass over this thread's panels; more: every chunk over each cached block of panels
    const int64_t step = xts.size() == 1 ? b1 - b0 : kBlockPanels;
    for (int64_t q0 = b0; q0 < b1; q0 += step) {
      const int64_t q1 = std::min(b1, q0 + step);
      for (size_t c = 0; c < xts.size(); ++c)
        kBlocks<W>[xts[c].size(1) - 1](xts[c].data_ptr<float>(), w, scale, out + c * kMaxRows * N, N, K, N, q0, q1);
    }
  });
  return y;
}

void check_rows(const torch::Tensor& x, const torch::Tensor& panels, int64_t N, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              name, ": expected 2-D float32 CPU rows, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == kPanel && panels.is_contiguous() &&
              panels.size(1) == x.size(1) && panels.size(0) == (N + kPanel - 1) / kPanel,
              name, ": panels ", panels.sizes(), " do not fit rows ", x.sizes(), " and ", N, " outputs");
}

}  // namespace

// x [m, K] (any m >= 1), panels from pack_panels of a [N, K] weight -> y [m, N].
torch::Tensor panel_linear(const torch::Tensor& x, const torch::Tensor& panels, int64_t N) {
  check_rows(x, panels, N, "panel_linear");
  TORCH_CHECK(panels.scalar_type() == at::kFloat, "panel_linear: float32 panels expected");
  return panels_product<float>(x, panels.data_ptr<float>(), N);
}

// W [N, K] float32 -> (its int8 copy in panels [ceil(N / 16), K, 16], one float32 scale per output row padded to
// whole panels): row j is scale_j * q_j with q_j = round(w_j / scale_j) (float32 division, rounded half to even as
// torch.round), scale_j = max|w_j| / 127 in float32 (0 rows: scale 0). One pass over W, the panels' rows in parallel.
std::vector<torch::Tensor> pack_panels_i8(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "pack_panels_i8: expected a 2-D float32 CPU weight, got ", weight.sizes(), " ", weight.scalar_type());
  auto w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), P = (N + kPanel - 1) / kPanel;
  auto q = torch::zeros({P, K, kPanel}, w.options().dtype(at::kChar));
  auto scale = torch::zeros({P * kPanel}, w.options());
  const float* src = w.data_ptr<float>();
  int8_t* dst = q.data_ptr<int8_t>();
  float* a = scale.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t j0, int64_t j1) {
    std::vector<int8_t> row_q(K);                      // one row, contiguous (a loop the compiler vectorizes)
    for (int64_t j = j0; j < j1; ++j) {
      const float* row = src + j * K;
      float peak = 0.0f;
      for (int64_t k = 0; k < K; ++k) peak = std::max(peak, std::fabs(row[k]));
      a[j] = peak / 127.0f;
      const float safe = a[j] > 0.0f ? a[j] : 1.0f;
      for (int64_t k = 0; k < K; ++k)
        row_q[k] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(row[k] / safe))));
      int8_t* out = dst + (j / kPanel) * K * kPanel + j % kPanel;
      for (int64_t k = 0; k < K; ++k) out[k * kPanel] = row_q[k];
    }
  });
  return {q, scale};
}

// The norms the argmax screen's error bound is made of, per output row j of W [N, K] and its int8 copy (q, scale
// from pack_panels_i8): [N, 3] float64 (||w_j - w~_j||, ||w_j||, ||w~_j||), w~_j = scale_j q_j, every product and
// sum in float64 (hf_cascade/backends/cpu/argmax_screen.py rounds the bound up from these).
torch::Tensor screen_norms(const torch::Tensor& weight, const torch::Tensor& q, const torch::Tensor& scale) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "screen_norms: expected a 2-D float32 CPU weight, got ", weight.sizes(), " ", weight.scalar_type());
  auto w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), P = (N + kPanel - 1) / kPanel;
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous() && q.dim() == 3 && q.size(0) == P && q.size(1) == K &&
              q.size(2) == kPanel && scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
              scale.numel() == P * kPanel, "screen_norms: q and scale are not pack_panels_i8's of this weight");
  auto out = torch::empty({N, 3}, w.options().dtype(at::kDouble));
  const float* src = w.data_ptr<float>();
  const int8_t* qs = q.data_ptr<int8_t>();
  const float* a = scale.data_ptr<float>();
  double* norms = out.data_ptr<double>();
  at::parallel_for(0, N, 64, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const float* row = src + j * K;
      const int8_t* qj = qs + (j / kPanel) * K * kPanel + j % kPanel;
      const double aj = a[j];
      double diff = 0.0, wsq = 0.0, csq = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double c = static_cast<double>(qj[k * kPanel]) * aj, v = row[k];
        diff += (v - c) * (v - c);
        wsq += v * v;
        csq += c * c;
      }
      norms[3 * j] = std::sqrt(diff);
      norms[3 * j + 1] = std::sqrt(wsq);
      norms[3 * j + 2] = std::sqrt(csq);
    }
  });
  return out;
}

// x [m, K] float32 @ (the int8 copy).T -> y [m, N] float32: a quarter of the bytes of panel_linear per pass; each
// weight widened to float32 exactly, products and sums in float32, each sum multiplied by its row's scale once.
torch::Tensor panel_linear_i8(const torch::Tensor& x, const torch::Tensor& panels, const torch::Tensor& scale,
                              int64_t N) {
  check_rows(x, panels, N, "panel_linear_i8");
  TORCH_CHECK(panels.scalar_type() == at::kChar, "panel_linear_i8: int8 panels expected");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == panels.size(0) * kPanel,
              "panel_linear_i8: one float32 scale per padded output row expected");
  return panels_product<int8_t>(x, panels.data_ptr<int8_t>(), N, scale.data_ptr<float>());
}

void register_screen(pybind11::module& m);   // screen.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  register_screen(m);                   // screen.cpp: the argmax screen's candidates (and its VNNI product)
  m.def("pack_panels_i8", &pack_panels_i8, "W [N, K] -> (int8 panels [ceil(N/16), K, 16], scales [ceil(N/16) * 16])");
  m.def("screen_norms", &screen_norms, "W [N, K], its int8 copy -> [N, 3] float64: ||w - w~||, ||w||, ||w~|| per row");
  m.def("panel_linear_i8", &panel_linear_i8, "x [m, K] @ (scale * q).T with the int8 panels -> [m, N]");
  m.def("pack_panels", &pack_panels, "W [N, K] -> panels [ceil(N/16), K, 16]");
  m.def("panel_linear", &panel_linear, "x [m, K] @ W.T with W's panels -> [m, N]");
}
