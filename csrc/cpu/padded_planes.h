// The padded planes that the implicit route's padded kernels share (implicit_nhwc_cpu.cpp's
// padded rows, implicit_weight_grad_cpu.cpp): a stride-1 convolution's input copied into
// zero-padded [Hp, Wp] planes, and its output seen with the same row width. Output pixel (oh, ow)
// is then the extended pixel e = oh*Wp + ow (the columns ow >= OW are not output pixels), and tap
// (ki, kj) reads padded pixel e + offset(tap) for every e: one fixed offset per tap.
//
// A padded row is its left padding (pad_w zeros), its W pixels, then zeros up to Wp. Its right
// padding need not be stored: the taps of a row's last output pixels that reach past Wp read the
// next row's left padding (or the zeros below the plane), which are the zeros they need. So Wp is
// W + pad_w, or OW where that is wider (padding beyond the kernel's reach), rather than W +
// 2*pad_w: fewer extended pixels that are not output pixels (5x5 at 28 pixels: 840 against 896;
// benchmarks/NOTES.md, section 104).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../plan.h"
#include "../shape.h"

namespace torch_convbp {

struct PaddedPlanes {
  // padded rows and columns; extended output pixels per plane (an even count where the VNNI
  // layout pairs them: the last one past the plane); the plane's length in pixels with the zero
  // tail past its end that the last extended pixels' taps (or runs of kw taps) reach; whether
  // the extended pixels go in pairs
  int64_t height, width, pixels, length;
  bool even_pixels;
  PaddedPlanes(const ConvShape& s, bool even)
      : height(s.height + 2 * s.pad_h),
        width(std::max(s.width + s.pad_w, s.out_width)),
        pixels(even ? (s.out_height * width + 1) / 2 * 2 : s.out_height * width),
        length(height * width + (s.kernel_w - 1) * s.dilation_w + 1),
        even_pixels(even) {}
  int64_t offset(const ConvShape& s, int64_t tap) const {
    return tap / s.kernel_w * s.dilation_h * width + tap % s.kernel_w * s.dilation_w;
  }
};

// The padded copies of a chunk of images take at most this many bytes and the workspace limit,
// or one image: written, then read by the GEMMs while still in L2 (the whole batch's copies at
// once took 1.07x the time of the weight gradient at 64@56: benchmarks/NOTES.md, section 69).
constexpr int64_t kPaddedChunkBytes = int64_t{2} << 20;

// The images per chunk, for copies of image_bytes bytes per image.
inline int64_t padded_chunk_images(int64_t image_bytes, int64_t batch) {
  const int64_t budget = std::min(workspace_limit(), kPaddedChunkBytes);
  return std::clamp<int64_t>(budget / std::max<int64_t>(image_bytes, 1), 1,
                             std::max<int64_t>(batch, 1));
}

}  // namespace torch_convbp
