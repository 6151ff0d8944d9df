// The depthwise 3x3 forward and input gradient of stride 1, one output channel per input channel,
// on the inner pixels of a row of NHWC float32 sums (depthwise_strips_cpu.h), strip by strip.
//
// A strip is kStripPixels adjacent result pixels and one vector of channels, on AVX-512. Its sums
// and the vector's nine weights stay in registers; each kernel row loads the strip's source pixels
// once, kStripPixels + 2 of them, for the three taps that read each. The general kernels
// (depthwise_nhwc_cpu.cpp: a pixel's terms, four pixels side by side) load the weight and the
// source pixel for every multiply-add, and waited on those loads: 576@14 fed channels_last
// took 1.3-1.5x oneDNN's time, one thread or two (benchmarks/NOTES.md, section 113).
//
// The sums are those of the general kernels, bit for bit: each result starts from zero and adds
// its terms in their order, (ki, kj) for the forward and for the input gradient (the forward's
// taps that read the result's pixel), by one multiply-add each (vector_ops.h: every lane rounded
// alike). On an inner pixel every kernel column's tap reads inside the
// row; a kernel row whose source row is padding is left out, as the general kernels leave it.
//
// bfloat16 source and result rows are read and written as they are: each loaded vector widened
// to float32 (exact), each sum rounded to bfloat16 as it is stored (as round_to_bfloat16 rounds),
// so the same values are summed as on rows widened beforehand, with no pass of their own over the
// rows (benchmarks/NOTES.md, section 122).
#include "depthwise_strips_cpu.h"

#include <algorithm>

#include "vector_ops.h"

namespace torch_convbp {
namespace {

// AVX-512's 32 registers hold a strip's 8 sums, the nine weights and a kernel row's 10 source
// pixels. Only there: with AVX2's 16 (a strip of 4, the weights spilled) 128@56's forward took
// 1.14-1.17x the general kernels' time under AVX2 emulation (NOTES section 113).
constexpr int kStripPixels = 8;

#ifdef TORCH_CONVBP_AVX512_BANDS
using Floats = Avx512Ops::Floats;

// 16 values from p as float32: bfloat16's bits as the upper half of a float's.
TORCH_CONVBP_AVX512 inline Floats load_floats(const float* p) { return _mm512_loadu_ps(p); }
TORCH_CONVBP_AVX512 inline Floats load_floats(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// 16 float32 sums stored at p; bfloat16 rounded to nearest even as bfloat16_cpu.h's
// round_to_bfloat16 (add 0x7FFF plus the lowest bit kept, drop the low half; a NaN as 0x7FC0).
TORCH_CONVBP_AVX512 inline void store_floats(float* p, Floats v) { _mm512_storeu_ps(p, v); }
TORCH_CONVBP_AVX512 inline void store_floats(c10::BFloat16* p, Floats v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lowest_kept = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lowest_kept);
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(rounded));
}

struct Strips {
  // Result row `row` (an output row of the forward, an input row of the input gradient) of
  // `source` (the image the pass reads, NHWC), its pixels `strips` (whole strips: strip_pixels)
  // for every vector of channels, into `result` (the row, NHWC).
  template <class Ops, typename T>
  static TORCH_CONVBP_INLINE void run(StripPass pass, const T* source, const float* w_by_tap,
                                      int64_t row, Span strips, T* result, const ConvShape& s) {
    using V = typename Vector<float, Ops::kBytes>::type;
    static_assert(Ops::kBytes == 64, "the strips' loads and stores are AVX-512's");
    constexpr int64_t lanes = Vector<float, Ops::kBytes>::lanes;
    constexpr int P = kStripPixels;
    const bool forward = pass == StripPass::forward;
    const int64_t c = s.in_channels;
    const int64_t source_height = forward ? s.height : s.out_height;
    const int64_t source_width = forward ? s.width : s.out_width;
    // The source row of each kernel row (null in the padding). The forward's tap (ki, kj) of
    // output pixel (oh, ow) reads input pixel (oh - pad + ki, ow - pad + kj); the input
    // gradient's term (ki, kj) of input pixel (ih, iw) reads dY at (ih + pad - ki, iw + pad - kj).
    const T* rows[3];
    for (int ki = 0; ki < 3; ++ki) {
      const int64_t r = forward ? row - s.pad_h + ki : row + s.pad_h - ki;
      rows[ki] = r >= 0 && r < source_height ? source + r * source_width * c : nullptr;
    }
    // A strip from pixel x reads source pixels x + first + q, q < P + 2; its pixel p's tap kj
    // the one at q = p + kj (forward) or p + 2 - kj (input gradient).
    const int64_t first = forward ? -s.pad_w : s.pad_w - 2;
    // Strip by strip, then its vectors of channels: each pixel's channels are read and written in
    // one pass, in order. Vector by vector, each strip then (its nine weights loaded once per
    // vector) walked the row once per vector, 64 bytes of every pixel at a time: 128@56's
    // forward took 1.25x the time on two threads, its input gradient 1.18x (benchmarks/NOTES.md,
    // section 119).
    for (int64_t x = strips.begin; x < strips.end; x += P) {
      for (int64_t ch = 0; ch + lanes <= c; ch += lanes) {
        V w[9];
        for (int t = 0; t < 9; ++t) w[t] = load_floats(w_by_tap + t * c + ch);
        V sum[P];
        for (int p = 0; p < P; ++p) sum[p] = Ops::template splat<V>(0.f);
        for (int ki = 0; ki < 3; ++ki) {
          if (rows[ki] == nullptr) continue;
          const T* pixels = rows[ki] + (x + first) * c + ch;
          V in[P + 2];
          for (int q = 0; q < P + 2; ++q) in[q] = load_floats(pixels + q * c);
          for (int kj = 0; kj < 3; ++kj) {
            for (int p = 0; p < P; ++p) {
              sum[p] = Ops::multiply_add(w[ki * 3 + kj], in[forward ? p + kj : p + 2 - kj], sum[p]);
            }
          }
        }
        for (int p = 0; p < P; ++p) store_floats(result + (x + p) * c + ch, sum[p]);
      }
    }
  }
};

#endif  // TORCH_CONVBP_AVX512_BANDS

// A 2-D convolution's 3x3 kernel, stride 1, undilated, one output channel per input channel.
[[maybe_unused]] bool takes_strips(const ConvShape& s) {
  return s.is_planar() && s.kernel_h == 3 && s.kernel_w == 3 && s.stride_h == 1 &&
         s.stride_w == 1 && s.dilation_h == 1 && s.dilation_w == 1 &&
         s.out_channels == s.in_channels && s.groups == s.in_channels;
}

template <typename T>
int64_t strips_of(StripPass pass, const T* source, const float* w_by_tap, int64_t row, Span columns,
                  T* result, const ConvShape& s) {
  const Span strips = strip_pixels(s, columns);  // none where the strips do not run here
  if (strips.end == strips.begin) return columns.begin;
#ifdef TORCH_CONVBP_AVX512_BANDS
  run_compiled_for<Strips>(Avx512Ops{}, pass, source, w_by_tap, row, strips, result, s);
#else
  (void)pass, (void)source, (void)w_by_tap, (void)row, (void)result;
#endif
  return strips.end;
}

}  // namespace

Span strip_pixels(const ConvShape& s, Span columns) {
  bool runs = false;
#ifdef TORCH_CONVBP_AVX512_BANDS
  constexpr int64_t lanes = Vector<float, Avx512Ops::kBytes>::lanes;
  runs = cpu_has_avx512() && takes_strips(s) && s.in_channels % lanes == 0;
#else
  (void)s;
#endif
  const int64_t strips =
      runs ? std::max<int64_t>(columns.end - columns.begin, 0) / kStripPixels : 0;
  if (strips == 0) return {0, 0};
  return {columns.begin, columns.begin + strips * kStripPixels};
}

int64_t depthwise_strips(StripPass pass, const float* source, const float* w_by_tap, int64_t row,
                         Span columns, float* result, const ConvShape& s) {
  return strips_of(pass, source, w_by_tap, row, columns, result, s);
}

int64_t depthwise_strips(StripPass pass, const c10::BFloat16* source, const float* w_by_tap,
                         int64_t row, Span columns, c10::BFloat16* result, const ConvShape& s) {
  return strips_of(pass, source, w_by_tap, row, columns, result, s);
}

}  // namespace torch_convbp
