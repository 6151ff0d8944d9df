// Helpers shared by the CPU kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../shape.h"
#include "../taps.h"

// Compiles a function twice on x86-64, for AVX2+FMA and for the baseline, and picks one at load
// time by what the CPU has (GCC function multiversioning). For the arithmetic kernels, which the
// compiler vectorizes: the extension is built for the baseline x86-64 otherwise.
// TORCH_CONVBP_WIDE_VECTOR_CLONES adds an AVX-512 clone, for the kernels that gain from it: the
// channels_last depthwise kernels (11-22% on an AVX-512 Xeon), where the others did not gain or
// lost (benchmarks/NOTES.md, section 31). The clones round alike: every multiply-add is written
// as one (summation.h), and vectorizing across outputs keeps each output's order of operations.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TORCH_CONVBP_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define TORCH_CONVBP_WIDE_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TORCH_CONVBP_VECTOR_CLONES
#define TORCH_CONVBP_WIDE_VECTOR_CLONES
#endif

// Forces a helper of those kernels to be inlined into its caller, so that it is compiled into
// the caller's clone: GCC's own choice varied with the torch headers it was built against, and an
// out-of-line copy is compiled for the baseline, without the clone's vector instructions
// (benchmarks/NOTES.md, section 19).
#if defined(__GNUC__)
#define TORCH_CONVBP_INLINE inline __attribute__((always_inline))
#else
#define TORCH_CONVBP_INLINE inline
#endif

// Keeps a hot loop nest in a function of its own, where GCC schedules it as well as it did
// before that nest was shared by images and volumes: inlined into col2im's task loop, the strided
// 2-D col2im ran 15% slower (benchmarks/NOTES.md, section 29).
#if defined(__GNUC__)
#define TORCH_CONVBP_NOINLINE __attribute__((noinline))
#else
#define TORCH_CONVBP_NOINLINE
#endif

namespace torch_convbp {

// x / d rounded down and rounded up, for x of either sign and d > 0 (C++'s / rounds toward zero),
// and x mod d in [0, d).
TORCH_CONVBP_INLINE int64_t floor_div(int64_t x, int64_t d) {
  const int64_t q = x / d;
  return q * d > x ? q - 1 : q;
}
TORCH_CONVBP_INLINE int64_t ceil_div_signed(int64_t x, int64_t d) {
  const int64_t q = x / d;
  return q * d < x ? q + 1 : q;
}
TORCH_CONVBP_INLINE int64_t floor_mod(int64_t x, int64_t d) { return x - floor_div(x, d) * d; }

// The output columns [begin, end) whose input column ow*stride + offset lies in [0, width).
struct Span {
  int64_t begin, end;
};
TORCH_CONVBP_INLINE Span valid_columns(int64_t offset, int64_t stride, int64_t width,
                                       int64_t out_width) {
  const int64_t begin = std::max<int64_t>(0, ceil_div_signed(-offset, stride));
  const int64_t last = width - 1 - offset;  // the largest ow*stride allowed
  const int64_t end = last < 0 ? 0 : std::min(out_width, last / stride + 1);
  return {std::min(begin, end), end};
}

// Enough multiply-adds per parallel task to be worth a thread.
constexpr int64_t kGrainWork = 32768;
inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kGrainWork / std::max<int64_t>(work_per_item, 1));
}

// The input row that output row oh reads at kernel row ki, or -1 in the padding.
inline int64_t input_row(const ConvShape& s, int64_t oh, int64_t ki) {
  const int64_t ih = input_index(oh, s.stride_h, s.pad_h, ki, s.dilation_h);
  return ih >= 0 && ih < s.height ? ih : -1;
}

// Calls f(tap, x) for each tap (ki, kj) of output pixel (oh, ow) that reads inside the image, in
// (ki, kj) order: tap = ki * kw + kj, x the NHWC input pixel it reads (image: one NHWC image).
template <typename scalar_t, typename F>
TORCH_CONVBP_INLINE void for_each_tap_inside(const scalar_t* image, int64_t oh, int64_t ow,
                                             const ConvShape& s, F&& f) {
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    const int64_t ih = input_row(s, oh, ki);
    if (ih < 0) continue;
    for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
      const int64_t iw = input_index(ow, s.stride_w, s.pad_w, kj, s.dilation_w);
      if (iw < 0 || iw >= s.width) continue;
      f(ki * s.kernel_w + kj, image + (ih * s.width + iw) * s.in_channels);
    }
  }
}

// Asks the CPU to bring the bytes [p, p + bytes) toward its L2 cache, a cache line at a time in
// memory order: a hint, which changes no result. Always inlined, and so should its callers be:
// GCC took a function whose only effect is a prefetch for one with no effect at all, and dropped
// the calls (benchmarks/NOTES.md, section 96).
TORCH_CONVBP_INLINE void prefetch_to_l2(const void* p, int64_t bytes) {
#if defined(__GNUC__)
  const char* line = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(line + b, /*rw=*/0, /*locality=*/2);
#endif
}

// The input rows [begin, end) that the output rows [first_row, first_row + rows) read.
inline Span band_input_rows(const ConvShape& s, int64_t first_row, int64_t rows) {
  const int64_t top = input_index(first_row, s.stride_h, s.pad_h, int64_t{0}, s.dilation_h);
  const int64_t bottom =
      input_index(first_row + rows - 1, s.stride_h, s.pad_h, s.kernel_h - 1, s.dilation_h) + 1;
  return {std::clamp<int64_t>(top, 0, s.height), std::clamp<int64_t>(bottom, 0, s.height)};
}

// The output columns of a row that kernel column kj reads inside the image, and the offset:
// output column ow reads input column ow * stride_w + offset.
struct Tap {
  int64_t offset;
  Span columns;
};
inline Tap tap_columns(const ConvShape& s, int64_t kj) {
  const int64_t offset = input_index(int64_t{0}, s.stride_w, s.pad_w, kj, s.dilation_w);
  return {offset, valid_columns(offset, s.stride_w, s.width, s.out_width)};
}

// The output columns whose every tap reads inside the image: those of the first and of the last
// kernel column (empty where there are none).
inline Span inner_columns(const ConvShape& s) {
  const Span first = tap_columns(s, 0).columns, last = tap_columns(s, s.kernel_w - 1).columns;
  const int64_t begin = std::max(first.begin, last.begin);
  return {begin, std::max(begin, std::min(first.end, last.end))};
}

// The output rows whose every kernel row reads inside the image (empty where there are none).
inline Span inner_rows(const ConvShape& s) {
  const auto rows_of = [&](int64_t ki) {
    const int64_t offset = input_index(int64_t{0}, s.stride_h, s.pad_h, ki, s.dilation_h);
    return valid_columns(offset, s.stride_h, s.height, s.out_height);
  };
  const Span first = rows_of(0), last = rows_of(s.kernel_h - 1);
  const int64_t begin = std::max(first.begin, last.begin);
  return {begin, std::max(begin, std::min(first.end, last.end))};
}

// Calls f(ow, iw) for each output column ow of the tap, with iw = ow * stride + offset its input
// column. The unit stride is spelt out, so that the compiler vectorizes the (inlined) body.
template <typename F>
inline void for_each_column(int64_t stride, const Tap& tap, F&& f) {
  if (stride == 1) {
    for (int64_t ow = tap.columns.begin; ow < tap.columns.end; ++ow) f(ow, ow + tap.offset);
  } else {
    for (int64_t ow = tap.columns.begin; ow < tap.columns.end; ++ow) {
      f(ow, ow * stride + tap.offset);
    }
  }
}

}  // namespace torch_convbp
