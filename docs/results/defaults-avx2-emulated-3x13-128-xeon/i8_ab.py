import sys, time, torch, re
from torch.utils.cpp_extension import load
torch.set_num_threads(2)
src = open("/work/main/hf_cascade/backends/cpu/csrc/panel_linear.cpp").read()
variant = sys.argv[1]
march = sys.argv[2] if len(sys.argv) > 2 else "x86-64-v3"
if variant == "generic":
    src = src.replace("#elif defined(__AVX2__)\n  const __m128i b", "#elif 0\n  const __m128i b")
elif variant == "shuffle":
    old = src[src.index("#elif defined(__AVX2__)\n  const __m128i b"):src.index("#else\n  typedef int8_t i8x16")]
    new = """#elif defined(__AVX2__)
  typedef float vec8 __attribute__((vector_size(32)));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const vec8 lo = (vec8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  const vec8 hi = (vec8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
  v = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
"""
    src = src.replace(old, new)
path = f"/work/prof/v_{variant}.cpp"
open(path, "w").write(src)
ext = load(f"v2_{variant}_{march.replace('-', '_')}", [path], extra_cflags=["-O3", f"-march={march}", "-fopenmp"], extra_ldflags=["-fopenmp"])
W = torch.randn(262144, 640)
q, s = ext.pack_panels_i8(W)
pf = ext.pack_panels(W)
def med(f, reps=7):
    ts = []
    for r in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return round(ts[len(ts)//2] * 1e3, 1)
ref = None
for m in (1, 2, 3, 4, 6, 8):
    x = torch.randn(m, 640)
    y = ext.panel_linear_i8(x, q, s, 262144)
    print(variant, march, m, "i8", med(lambda: ext.panel_linear_i8(x, q, s, 262144)), "f32", med(lambda: ext.panel_linear(x, pf, 262144)), "mkl", med(lambda: torch.nn.functional.linear(x, W)), flush=True)
