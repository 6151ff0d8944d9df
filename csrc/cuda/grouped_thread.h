// What one CUDA thread of the direct grouped kernels computes, as host-and-device functions: the
// launch sequences of grouped_launch.h run the functors at the end, on the GPU and, through the
// CPU harness (tests/cuda_harness/), on the CPU, where the results are compared bitwise with the
// CPU kernels (cpu/grouped_forward_cpu.cpp, cpu/grouped_weight_grad_cpu.cpp), which sum in the
// same orders.
//
// A grouped convolution whose groups are too narrow for the column matrix's GEMMs (route.cpp), on
// NHWC activations: input [N, H, W, C] and output [N, OH, OW, Cout] in memory
// (dense channels_last), the weight [Cout, C/G, kh, kw] contiguous. Output channel o of group
// g = o / (Cout/G) reads the group's input channels g * C/G + i.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

#include "../shape.h"
#include "../summation.h"
#include "../taps.h"
#include "plane_dims.h"

namespace torch_convbp {

// ConvShape in the kernel's index type, with each group's channel counts.
template <typename index_t>
struct GroupedDims : PlaneDims<index_t> {
  index_t group_in, group_out;
  explicit GroupedDims(const ConvShape& s)
      : PlaneDims<index_t>(s),
        group_in(s.in_channels / s.groups),
        group_out(s.out_channels / s.groups) {}
};

// The output element at NHWC offset i: the sum over the taps in (ki, kj) order, and within a
// tap over the group's input channels i in order, of weight times input; one rounding per term
// (multiply_add), one rounding to scalar_t at the end. Taps in the padding add nothing. A function
// object, the element of an ElementThread (launch.h).
struct GroupedOutput {
  template <typename scalar_t, typename index_t>
  C10_HOST_DEVICE scalar_t operator()(const scalar_t* input, const scalar_t* weight,
                                      const GroupedDims<index_t>& s, index_t i) const {
    using acc_t = at::opmath_type<scalar_t>;
    const index_t o = i % s.out_channels, pixel = i / s.out_channels;
    const index_t ow = pixel % s.out_width, oh = pixel / s.out_width % s.out_height;
    const index_t n = pixel / (s.out_width * s.out_height);
    const index_t first_channel = o / s.group_out * s.group_in;
    const index_t taps = s.kernel_h * s.kernel_w;
    const scalar_t* w = weight + o * s.group_in * taps;  // w[c * taps + tap]: [C/G, kh, kw]
    acc_t sum = 0;
    for (index_t ki = 0; ki < s.kernel_h; ++ki) {
      const index_t ih = input_index(oh, s.stride_h, s.pad_h, ki, s.dilation_h);
      if (ih < 0 || ih >= s.height) continue;
      for (index_t kj = 0; kj < s.kernel_w; ++kj) {
        const index_t iw = input_index(ow, s.stride_w, s.pad_w, kj, s.dilation_w);
        if (iw < 0 || iw >= s.width) continue;
        const scalar_t* x =
            input + ((n * s.height + ih) * s.width + iw) * s.channels + first_channel;
        const index_t tap = ki * s.kernel_w + kj;
        for (index_t c = 0; c < s.group_in; ++c) {
          sum = multiply_add(static_cast<acc_t>(w[c * taps + tap]), static_cast<acc_t>(x[c]), sum);
        }
      }
    }
    return static_cast<scalar_t>(sum);
  }
};

// The weight gradient is summed image by image: a thread per (image, entry) sums the image's
// share of the entry (below) into a buffer of partial sums, [images, taps, C/G, Cout] for the
// images of a pass, and a second kernel adds each entry's partial sums to its total in the order of
// the images (add_image_partials). The passes take as many images as keep the buffer within
// this many elements (16 MiB of float32), one image at least.
constexpr int64_t kImagePartialElements = int64_t{1} << 22;
C10_HOST_DEVICE inline int64_t images_per_pass(int64_t entries, int64_t batch) {
  const int64_t images = kImagePartialElements / (entries > 0 ? entries : 1);
  return images < 1 ? 1 : (images < batch ? images : batch);
}

// Entry e of the buffer's order [taps, C/G, Cout] (adjacent threads take adjacent output
// channels: adjacent dy, and one x value for a whole group), and its place in the weight
// gradient [Cout, C/G, kh, kw].
template <typename index_t>
struct WeightEntry {
  index_t o, i, tap;
  C10_HOST_DEVICE WeightEntry(index_t e, const GroupedDims<index_t>& s)
      : o(e % s.out_channels),
        i(e / s.out_channels % s.group_in),
        tap(e / (s.out_channels * s.group_in)) {}
  C10_HOST_DEVICE index_t in_weight(const GroupedDims<index_t>& s) const {
    return (o * s.group_in + i) * (s.kernel_h * s.kernel_w) + tap;
  }
};

// Image n's share of weight-gradient entry (o, i, tap): the sum from 0 over the image's output
// pixels (oh, ow) in row-major order whose tap reads inside the image, of dy[n, oh, ow, o] times
// x[n, ih, iw, g * C/G + i] (g = o's group); one rounding per term (multiply_add).
template <typename scalar_t, typename index_t>
C10_HOST_DEVICE inline at::opmath_type<scalar_t> grouped_weight_grad_image(
    const scalar_t* input, const scalar_t* grad_output, const GroupedDims<index_t>& s, index_t n,
    const WeightEntry<index_t>& e) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t ki = e.tap / s.kernel_w, kj = e.tap % s.kernel_w;
  const index_t channel = e.o / s.group_out * s.group_in + e.i;
  acc_t sum = 0;
  for (index_t oh = 0; oh < s.out_height; ++oh) {
    const index_t ih = input_index(oh, s.stride_h, s.pad_h, ki, s.dilation_h);
    if (ih < 0 || ih >= s.height) continue;
    for (index_t ow = 0; ow < s.out_width; ++ow) {
      const index_t iw = input_index(ow, s.stride_w, s.pad_w, kj, s.dilation_w);
      if (iw < 0 || iw >= s.width) continue;
      const index_t dy = ((n * s.out_height + oh) * s.out_width + ow) * s.out_channels + e.o;
      const index_t x = ((n * s.height + ih) * s.width + iw) * s.channels + channel;
      sum = multiply_add(static_cast<acc_t>(input[x]), static_cast<acc_t>(grad_output[dy]), sum);
    }
  }
  return sum;
}

// Entry e's total after a pass of `images` images: the partial sums [images, entries] added to
// it in the order of the images, one rounding each.
template <typename acc_t, typename index_t>
C10_HOST_DEVICE inline acc_t add_image_partials(acc_t total, const acc_t* partials, index_t images,
                                                index_t entries, index_t e) {
  for (index_t k = 0; k < images; ++k) total += partials[k * entries + e];
  return total;
}

// The weight gradient's threads, as the functors a Launcher's grid runs (launch.h).
// The weight gradient's first kernel: thread t = (image of the pass, entry) writes that image's
// share of the entry to partials [images, entries].
template <typename scalar_t, typename index_t>
struct ImagePartialThread {
  const scalar_t* input;
  const scalar_t* grad_output;
  at::opmath_type<scalar_t>* partials;
  GroupedDims<index_t> s;
  index_t first_image, entries;
  C10_HOST_DEVICE void operator()(index_t t) const {
    partials[t] = grouped_weight_grad_image(input, grad_output, s, first_image + t / entries,
                                            WeightEntry<index_t>(t % entries, s));
  }
};

// Its second kernel: entry e adds the pass's partial sums to its total; in the last pass
// (grad_weight given) it writes the weight gradient instead, rounded to scalar_t.
template <typename scalar_t, typename index_t>
struct AddPartialsThread {
  at::opmath_type<scalar_t>* totals;
  const at::opmath_type<scalar_t>* partials;
  scalar_t* grad_weight;
  GroupedDims<index_t> s;
  index_t images, entries;
  C10_HOST_DEVICE void operator()(index_t e) const {
    const auto total = add_image_partials(totals[e], partials, images, entries, e);
    if (grad_weight != nullptr) {
      grad_weight[WeightEntry<index_t>(e, s).in_weight(s)] = static_cast<scalar_t>(total);
    } else {
      totals[e] = total;
    }
  }
};

}  // namespace torch_convbp
