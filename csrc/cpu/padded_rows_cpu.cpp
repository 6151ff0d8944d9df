// Route implicit_nhwc's bfloat16 kernels on padded rows (padded_rows_cpu.h).
//
// bfloat16 of one group, undilated along the width (padded rows): the input copied once into
// zero-padded planes (padded_planes.h), so that output pixel (oh, ow) is the extended pixel
// e = oh*We + ow and tap (ki, kj) reads padded pixel stride_w*e + offset(ki, kj) for every e. One
// micro-kernel call then covers a block of up to kPaddedTilePixels extended pixels across rows
// (the columns ow >= OW computed and dropped) and a whole kernel row: its kw taps' runs of C
// channels are one run of kw*C (A's rows overlap, lda = stride_w*C), and their B matrices lie one
// after another (TapMatrices). A strided layer's padded rows lie in phase planes, so that the
// rows of extended pixels stay stride_w pixels apart (padded_planes.h). On AMX a call of one row
// and one tap, K = C = 64, spent about half its time loading and storing its C tiles (about 600
// GFLOP/s a core, section 57); with K = 3C and M = 256 the dense 3x3 forwards took 0.53-0.81x the
// time, the input gradients 0.45-0.79x (benchmarks/NOTES.md, section 70). Each output entry sums
// its kernel rows in order, each call's K in the micro-kernel's order, whatever the block: the bits
// depend neither on the blocks nor on the threads.
//
// The input gradient of a strided layer (or of one padded past the kernel's reach, which is no
// stride-1 convolution of dY) is stride_h x stride_w phase convolutions of dY, the sub-pixel form
// of a transposed convolution: dX pixel (i*sh + a, j*sw + b) is output (i, j) of phase (a, b), to
// which dY pixel (oh, ow) contributes through tap (ki, kj) where oh*sh - ph + ki*dh = i*sh + a,
// that is oh = i + (a + ph - ki*dh) / sh where that divides (and ow likewise). So each phase is a
// stride-1 correlation of dY with the taps whose reach divides, each at a fixed offset of dY rows
// and columns: padded rows again, on one padded copy of dY that every phase reads, its kernel
// rows' taps one call (undilated along the width: a phase's taps of a row read adjacent dY
// columns). It replaces a call per tap and dY row (the scatter of implicit_nhwc_cpu.cpp's tiles)
// whose calls of K = Cout, M = OW spent much of their time on C's loads and stores
// (benchmarks/NOTES.md, section 120). Each dX entry sums its phase's kernel rows in order, each
// call's K in the micro-kernel's order, so again the bits depend on no block or thread count.
#include "padded_rows_cpu.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../cpu_features.h"
#include "../scratch.h"
#include "bfloat16_cpu.h"
#include "cpu_kernels.h"
#include "microkernel.h"
#include "padded_planes.h"

namespace torch_convbp {
namespace {

using at::Tensor;
using T = c10::BFloat16;

constexpr int64_t kPaddedTilePixels = 256;
// A block's pixels a multiple of this, the rows of an AMX tile: cut evenly, 128@28's 812 extended
// pixels an image made blocks of 203, each with a partial last tile, and the forwards of 128@28
// and 64@56 took 1.1x the time of blocks of 208 and 256 (benchmarks/NOTES.md, section 120).
constexpr int64_t kTileRows = 16;
// Kernel rows in one call up to this many input channels (K = kw*C). On AMX 256: 512@7 took 1.4x
// with K = 1536, and a dilated layer's taps one by one on the padded copy 1.5x the row tiles
// (section 70). With AVX512_BF16 and no AMX (a Zen 4 EPYC) 128: the forward and input gradient
// of 256@14 (K = 768) ran slower than on the tiles' calls of one tap (K = 256), while 64@56 and
// 5x5 64@28 still gained from padded rows (section 109).
int64_t most_merged_channels() { return cpu_has_amx_bfloat16_microkernel() ? 256 : 128; }

// What the calls of one padded problem read, per kernel row r in order: A = the padded copy from
// pixel step*e + a_offset[r] of an image on, for its extended pixels e, K = k values per pixel
// (a kernel row's taps), its rows step pixels apart; B = b[r] [k, ldb] (the VNNI layout), the
// kernel row's taps' matrices one after another.
struct KernelRowCalls {
  std::vector<int64_t> a_offset;
  std::vector<const T*> b;
  int64_t step, k, ldb;
};

// The products of the padded copies of `images` images at `pad` (image_length pixels of
// `channels` each apart): each image's extended pixels [0, pixels) cut into blocks of at most
// kPaddedTilePixels (more where a batch of `batch` images would leave under kMinTiles tasks, at
// least 16 pixels each), each a multiple of kTileRows but the image's last, its output channels
// into blocks of kMaxTileChannels. A block's sums
// [m, nb] = the sum over the kernel rows in order of A_r [m, k] @ B_r [k, nb] (the first call
// stores), rounded into place(n, e) (output channel 0 of the result pixel of extended pixel e of
// image n), or dropped where place gives nullptr.
template <class Place>
void padded_products(const T* pad, int64_t image_length, int64_t channels, int64_t images,
                     int64_t batch, int64_t pixels, int64_t out_channels,
                     const KernelRowCalls& calls, const Place& place) {
  const int64_t per_tile = std::min(out_channels, kMaxTileChannels);
  const int64_t out_blocks = (out_channels + per_tile - 1) / per_tile;
  const int64_t blocks =
      std::clamp<int64_t>((kMinTiles + batch * out_blocks - 1) / (batch * out_blocks),
                          (pixels + kPaddedTilePixels - 1) / kPaddedTilePixels,
                          std::max<int64_t>((pixels + 15) / 16, 1));
  const int64_t block = ((pixels + blocks - 1) / blocks + kTileRows - 1) / kTileRows * kTileRows;
  at::parallel_for(0, images * blocks * out_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(block * per_tile);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t co = t % out_blocks * per_tile, e0 = t / out_blocks % blocks * block;
      const int64_t n = t / (out_blocks * blocks);
      const int64_t m = std::min(block, pixels - e0), nb = std::min(per_tile, out_channels - co);
      if (m <= 0) continue;
      const T* image = pad + n * image_length * channels;
      for (size_t r = 0; r < calls.b.size(); ++r) {
        // [m, nb] (+)= [m, k] @ [k, nb]: kernel row r's taps, A's rows overlapping
        micro_gemm(m, nb, calls.k, image + (calls.step * e0 + calls.a_offset[r]) * channels,
                   calls.step * channels, calls.b[r] + TapMatrices<T>::column(co), calls.ldb,
                   sums.data(), nb, /*add=*/r > 0);
      }
      for (int64_t i = 0; i < m; ++i) {
        if (T* to = place(n, e0 + i)) round_to_bfloat16(sums.data() + i * nb, nb, to + co);
      }
    }
    release_microkernel(/*vnni=*/true);
  });
}

// Copies `count` images of `rows` source rows (`source_width` pixels of `channels` each, NHWC)
// into their padded copies laid out as `p` (`pad`, p.length pixels apart): each padded row its
// left padding, the source row, then zeros up to p.width; zero rows outside the source; zeros
// after a plane's last row up to its end.
void copy_padded_rows(const T* source, int64_t rows, int64_t source_width, int64_t channels,
                      int64_t count, const PaddedPlanes& p, T* pad) {
  at::parallel_for(0, count * p.height, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {  // padded row r % Hp of image r / Hp
      const int64_t n = r / p.height, hp = r % p.height, h = hp - p.top;
      T* target = pad + (n * p.length + p.row_start(hp)) * channels;
      if (h < 0 || h >= rows) {
        std::memset(target, 0, p.width * channels * sizeof(T));  // bits only, as padded_source_row
      } else {
        padded_source_row(source + (n * rows + h) * source_width * channels, p.left, source_width,
                          channels, p.width, target);
      }
      if (p.ends_plane(hp)) {  // the rest of its plane
        std::memset(target + p.width * channels, 0,
                    (p.phase_length - (hp / p.phases + 1) * p.width) * channels * sizeof(T));
      }
    }
  });
}

// Runs body(first, count, pad) over the batch's chunks of images (padded_chunk_images), `pad`
// holding the chunk's padded copies of `source` ([batch, rows, source_width, channels], NHWC)
// laid out as `p`, made by copy_padded_rows first.
template <class Body>
void over_padded_chunks(const Tensor& source, int64_t rows, int64_t source_width, int64_t channels,
                        const PaddedPlanes& p, const Body& body) {
  const int64_t batch = source.size(0);
  const int64_t images = padded_chunk_images(p.length * channels * int64_t{sizeof(T)}, batch);
  const Tensor padded = empty_scratch({images * p.length * channels}, source.options());
  const CountedScratch counted(padded);
  const T* data = source.const_data_ptr<T>();
  T* pad = padded.mutable_data_ptr<T>();
  for (int64_t first = 0; first < batch; first += images) {
    const int64_t count = std::min(images, batch - first);
    copy_padded_rows(data + first * rows * source_width * channels, rows, source_width, channels,
                     count, p, pad);
    body(first, count, pad);
  }
}

}  // namespace

bool takes_padded_rows(const ConvShape& s) {
  return s.is_planar() && s.dilation_w == 1 && s.groups == 1 &&
         s.in_channels <= most_merged_channels();
}

void padded_convolution(const Tensor& x, const TapMatrices<T>& w, const ConvShape& s,
                        const Tensor& y) {
  const PaddedPlanes p(s, /*even_pixels=*/false);
  const int64_t c = s.in_channels;
  KernelRowCalls calls{{}, {}, /*step=*/s.stride_w, /*k=*/s.kernel_w * c, w.ldb};
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    calls.a_offset.push_back(p.offset(s, ki * s.kernel_w));
    calls.b.push_back(w.of(0, ki * s.kernel_w));
  }
  T* y_data = y.mutable_data_ptr<T>();
  over_padded_chunks(x, s.height, s.width, c, p, [&](int64_t first, int64_t count, const T* pad) {
    padded_products(pad, p.length, c, count, s.batch, p.pixels, s.out_channels, calls,
                    [&](int64_t n, int64_t e) -> T* {  // the extended pixels that are outputs
                      const int64_t oh = e / p.extended_width, ow = e % p.extended_width;
                      if (ow >= s.out_width) return nullptr;
                      return y_data + (((first + n) * s.out_height + oh) * s.out_width + ow) *
                                          s.out_channels;
                    });
  });
}

namespace {

// The taps of one phase along one dimension (rows or columns) of the input gradient: the kernel
// indices k whose reach phase + pad - k*dilation divides by the stride, by increasing offset
// (decreasing k), each with its offset: the dY index it reads less the phase output's index. And
// the phase's outputs along the dimension: the dX indices phase, phase + stride, ... below `size`.
struct PhaseTaps {
  std::vector<int64_t> taps, offsets;
  int64_t outputs;
};
PhaseTaps phase_taps(int64_t phase, int64_t size, int64_t stride, int64_t pad, int64_t kernel,
                     int64_t dilation) {
  PhaseTaps t{{}, {}, phase < size ? (size - phase + stride - 1) / stride : 0};
  for (int64_t k = kernel - 1; k >= 0; --k) {
    const int64_t reach = phase + pad - k * dilation;
    if (floor_mod(reach, stride) == 0) {
      t.taps.push_back(k);
      t.offsets.push_back(floor_div(reach, stride));
    }
  }
  return t;
}

// The padded copy of dY that every phase reads: zero rows and columns enough that each phase's
// taps of each of its outputs read inside it (rows above and below, columns left and right), and
// a tail for the extended pixels of a phase's last row. Its rows at least as wide as every
// phase's outputs.
PaddedPlanes phase_copy(const std::vector<PhaseTaps>& rows, const std::vector<PhaseTaps>& columns,
                        const ConvShape& s) {
  int64_t top = 0, bottom = 0, left = 0, right = 0, widest = 1;
  for (const PhaseTaps& r : rows) {
    if (r.taps.empty() || r.outputs == 0) continue;
    top = std::max(top, -r.offsets.front());
    bottom = std::max(bottom, r.outputs - 1 + r.offsets.back() - (s.out_height - 1));
  }
  for (const PhaseTaps& c : columns) {
    if (c.taps.empty() || c.outputs == 0) continue;
    left = std::max(left, -c.offsets.front());
    right = std::max(right, c.outputs - 1 + c.offsets.back() - (s.out_width - 1));
    widest = std::max(widest, c.outputs);
  }
  const int64_t height = top + s.out_height + bottom;
  const int64_t width = std::max(left + s.out_width + right, widest);
  int64_t length = height * width;
  for (const PhaseTaps& r : rows) {
    for (const PhaseTaps& c : columns) {
      if (r.taps.empty() || c.taps.empty() || r.outputs == 0 || c.outputs == 0) continue;
      // the last extended pixel's last kernel row's run of taps ends here
      const int64_t last = (r.outputs - 1 + top + r.offsets.back()) * width + width - 1 + left +
                           c.offsets.front() + static_cast<int64_t>(c.taps.size());
      length = std::max(length, last);
    }
  }
  return PaddedPlanes(height, width, top, left, length);
}

// The B matrices of one phase: its taps' tap matrices (the input gradient's, taps reversed) one
// after another, [rows][columns][K, N], so that a kernel row's are one run.
Tensor phase_matrices(const TapMatrices<T>& w, const PhaseTaps& rows, const PhaseTaps& columns,
                      const ConvShape& s) {
  const Tensor b =
      at::empty({static_cast<int64_t>(rows.taps.size() * columns.taps.size()), w.tap_stride},
                w.memory.options());
  T* to = b.mutable_data_ptr<T>();
  for (int64_t ki : rows.taps) {
    for (int64_t kj : columns.taps) {
      std::memcpy(to, w.of(0, s.taps() - 1 - (ki * s.kernel_w + kj)), w.tap_stride * sizeof(T));
      to += w.tap_stride;
    }
  }
  return b;
}

}  // namespace

bool takes_padded_input_grad(const ConvShape& s) {
  return s.is_planar() && !input_grad_convolution(s) && s.dilation_w == 1 && s.groups == 1 &&
         s.out_channels <= most_merged_channels();
}

void padded_input_grad(const Tensor& dy, const TapMatrices<T>& w, const ConvShape& s,
                       const Tensor& dx) {
  std::vector<PhaseTaps> rows, columns;
  for (int64_t a = 0; a < s.stride_h; ++a) {
    rows.push_back(phase_taps(a, s.height, s.stride_h, s.pad_h, s.kernel_h, s.dilation_h));
  }
  for (int64_t b = 0; b < s.stride_w; ++b) {
    columns.push_back(phase_taps(b, s.width, s.stride_w, s.pad_w, s.kernel_w, s.dilation_w));
  }
  const PaddedPlanes p = phase_copy(rows, columns, s);
  const int64_t c = s.out_channels, cin = s.in_channels;
  // each phase's B matrices and calls, in (a, b) order; none for a phase that no tap reaches
  std::vector<Tensor> matrices;
  std::vector<KernelRowCalls> calls;
  for (const PhaseTaps& r : rows) {
    for (const PhaseTaps& q : columns) {
      const int64_t row_taps = static_cast<int64_t>(q.taps.size());
      matrices.push_back(phase_matrices(w, r, q, s));
      calls.push_back({{}, {}, /*step=*/1, /*k=*/row_taps * c, w.ldb});
      if (row_taps == 0) continue;
      for (size_t m = 0; m < r.taps.size(); ++m) {
        calls.back().a_offset.push_back((p.top + r.offsets[m]) * p.width + p.left +
                                        q.offsets.front());
        calls.back().b.push_back(matrices.back().const_data_ptr<T>() + m * row_taps * w.tap_stride);
      }
    }
  }
  T* dx_data = dx.mutable_data_ptr<T>();
  const auto dx_pixel = [&](int64_t n, int64_t ih, int64_t iw) {
    return dx_data + ((n * s.height + ih) * s.width + iw) * cin;
  };
  over_padded_chunks(
      dy, s.out_height, s.out_width, c, p, [&](int64_t first, int64_t count, const T* pad) {
        for (int64_t a = 0; a < s.stride_h; ++a) {
          for (int64_t b = 0; b < s.stride_w; ++b) {
            const PhaseTaps &r = rows[a], &q = columns[b];
            const KernelRowCalls& phase = calls[a * s.stride_w + b];
            if (r.outputs == 0 || q.outputs == 0) continue;
            if (phase.b.empty()) {  // no tap reaches these dX pixels
              at::parallel_for(0, count * r.outputs, 16, [&](int64_t begin, int64_t end) {
                for (int64_t row = begin; row < end; ++row) {
                  for (int64_t j = 0; j < q.outputs; ++j) {
                    std::memset(dx_pixel(first + row / r.outputs, row % r.outputs * s.stride_h + a,
                                         j * s.stride_w + b),
                                0, cin * sizeof(T));
                  }
                }
              });
              continue;
            }
            padded_products(pad, p.length, c, count, s.batch, r.outputs * p.width, cin, phase,
                            [&](int64_t n, int64_t e) -> T* {  // output (i, j) of phase (a, b)
                              const int64_t i = e / p.width, j = e % p.width;
                              if (j >= q.outputs) return nullptr;
                              return dx_pixel(first + n, i * s.stride_h + a, j * s.stride_w + b);
                            });
          }
        }
      });
}

}  // namespace torch_convbp
