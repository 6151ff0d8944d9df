// The padded planes that the implicit route's padded kernels share (implicit_nhwc_cpu.cpp's
// padded rows, implicit_weight_grad_cpu.cpp): a convolution's input copied into zero-padded
// [Hp, Wp] planes, and its output seen with rows of Wp / stride_w pixels. Output pixel (oh, ow)
// is then the extended pixel e = oh*We + ow (We = Wp / stride_w; the columns ow >= OW are not
// output pixels), and tap (ki, kj) reads padded pixel stride_w*e + offset(tap) for every e: one
// fixed offset per tap, the pixels stride_w apart.
//
// A strided convolution's padded rows are stored as stride_h phase planes, padded row hp as row
// hp / stride_h of plane hp % stride_h: output row oh reads, at kernel row ki, padded row
// oh*stride_h + ki*dh, which is row oh + ki*dh / stride_h of one plane, so that every output row
// steps by one plane row and the pixels stay stride_w apart across the rows. Wp is a multiple of
// stride_w. Stride 1: one plane, We = Wp.
//
// A padded row is its left padding (pad_w zeros), its W pixels, then zeros up to Wp. Its right
// padding need not be stored: the taps of a row's last output pixels that reach past Wp read the
// next row's left padding (or the zeros below the plane), which are the zeros they need. So Wp is
// W + pad_w, or OW * stride_w where that is wider (padding beyond the kernel's reach), rather than
// W + 2*pad_w: fewer extended pixels that are not output pixels (5x5 at 28 pixels: 840 against 896;
// benchmarks/NOTES.md, section 104).
//
// A volume (stride 1 only: the implicit weight gradient's) is its padded depth slices one after
// another in one plane, Dp = D + 2*pad_d slices of Hp rows: output pixel (od, oh, ow) is the
// extended pixel e = (od*Hp + oh)*Wp + ow (the rows oh >= OH of each slice are not output rows),
// and tap (kd, ki, kj) reads padded pixel e + (kd*dd*Hp + ki*dh)*Wp + kj*dw, again one fixed
// offset. As with the columns, a slice's bottom padding need not be stored: the taps that reach
// past its rows read the next slice's top padding (or pad_h zero rows past the last slice), so Hp
// is H + pad_h, or OH where that is more, rather than H + 2*pad_h (NOTES section 137).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "../plan.h"
#include "../shape.h"

namespace torch_convbp {

struct PaddedPlanes {
  // padded rows and columns, and the zero rows and columns before the source's; the phase
  // planes, the rows of each and an output row's extended pixels (We); extended output pixels
  // per image (an even count where the VNNI layout pairs them: the last one past the plane); a
  // phase plane's length in pixels with the zero tail past its end that the last extended pixels'
  // taps (or runs of kw taps) reach, and an image's length (its planes one after another);
  // whether the extended pixels go in pairs. Volumes: `height` rows per padded depth slice, and
  // `slices` of them (1 for images).
  int64_t height, width, top, left, phases, phase_rows, extended_width, pixels, phase_length,
      length, slices;
  bool even_pixels;
  PaddedPlanes(const ConvShape& s, bool even)
      : height(s.is_planar() ? s.height + 2 * s.pad_h : std::max(s.height + s.pad_h, s.out_height)),
        width(round_up(std::max(s.width + s.pad_w, s.out_width * s.stride_w), s.stride_w)),
        top(s.pad_h),
        left(s.pad_w),
        phases(s.stride_h),
        phase_rows((height + s.stride_h - 1) / s.stride_h),
        extended_width(width / s.stride_w),
        pixels(round_up(extended_rows(s) * extended_width, even ? 2 : 1)),
        phase_length(((s.depth + 2 * s.pad_d) * phase_rows + (s.is_planar() ? 0 : s.pad_h)) *
                         width +
                     (s.kernel_w - 1) * s.dilation_w + 1),
        length(phases * phase_length),
        slices(s.depth + 2 * s.pad_d),
        even_pixels(even) {}
  // One plane of `height` rows of `width` pixels, `top` zero rows and `left` zero columns before
  // the source's, `length` pixels with its zero tail, whose readers keep their own extended
  // pixels (padded_rows_cpu.cpp's phase convolutions): none here.
  PaddedPlanes(int64_t height, int64_t width, int64_t top, int64_t left, int64_t length)
      : height(height),
        width(width),
        top(top),
        left(left),
        phases(1),
        phase_rows(height),
        extended_width(width),
        pixels(0),
        phase_length(length),
        length(length),
        slices(1),
        even_pixels(false) {}
  // The extended rows of an image's (a volume's) output: OH, or the OD slices' Hp rows but the
  // last slice's OH.
  int64_t extended_rows(const ConvShape& s) const {
    return (s.out_depth - 1) * height + s.out_height;
  }
  // Where tap `tap` (kd, ki, kj) of extended pixel 0 reads, in pixels from the image's first plane.
  int64_t offset(const ConvShape& s, int64_t tap) const {
    const int64_t plane_taps = s.kernel_h * s.kernel_w;
    // padded rows below the output row's: a volume's depth taps whole slices of Hp rows (stride 1)
    const int64_t row =
        tap / plane_taps * s.dilation_d * height + tap % plane_taps / s.kernel_w * s.dilation_h;
    return row % s.stride_h * phase_length + row / s.stride_h * width +
           tap % s.kernel_w * s.dilation_w;
  }
  // The extended pixels [first, second) whose output slices pair input slices inside the volume
  // at depth tap kd (the others pair its depth padding), in pairs where they go in pairs; all of
  // them for an image.
  std::pair<int64_t, int64_t> depth_tap_pixels(const ConvShape& s, int64_t kd) const {
    const int64_t offset = kd * s.dilation_d - s.pad_d;  // input slice od + offset
    const int64_t first = std::clamp<int64_t>(-offset, 0, s.out_depth);
    const int64_t last = std::clamp<int64_t>(s.depth - offset, first, s.out_depth);
    if (first == last) return {0, 0};
    const int64_t pair = even_pixels ? 2 : 1;
    return {
        first * height * extended_width / pair * pair,
        std::min(round_up(((last - 1) * height + s.out_height) * extended_width, pair), pixels)};
  }
  // The bytes of one image's padded copies for the weight gradient: its input planes and its
  // extended output gradient, of elements that many bytes each.
  int64_t weight_grad_image_bytes(const ConvShape& s, int64_t element_size) const {
    return (s.in_channels * length + pixels * s.out_channels) * element_size;
  }
  // Where padded row hp starts, in pixels from the image's first plane.
  int64_t row_start(int64_t hp) const { return hp % phases * phase_length + hp / phases * width; }
  // Whether padded row hp is the last of its plane (the plane's tail follows it).
  bool ends_plane(int64_t hp) const { return hp + phases >= height; }

 private:
  static int64_t round_up(int64_t value, int64_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
  }
};

// Source row `row` (NHWC, `channels` per pixel, `source_width` pixels) padded: the columns
// [-left, -left + width) into [width, channels], zeros where they fall outside the row (the left
// padding, then the row, then zeros), as the kernel-row calls and the padded planes read it. Bits
// only: float32 and bfloat16 zeros are zero bytes, and a copy of c10::BFloat16 in a loop compiled
// to one 16-bit move per element (benchmarks/NOTES.md, section 53).
template <class T>
void padded_source_row(const T* row, int64_t left, int64_t source_width, int64_t channels,
                       int64_t width, T* padded) {
  const int64_t first = std::min(left, width);                                 // padded columns
  const int64_t inside = std::clamp<int64_t>(width - first, 0, source_width);  // the row's
  std::memset(padded, 0, first * channels * sizeof(T));
  std::memcpy(padded + first * channels, row, inside * channels * sizeof(T));
  std::memset(padded + (first + inside) * channels, 0,
              (width - first - inside) * channels * sizeof(T));
}

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
