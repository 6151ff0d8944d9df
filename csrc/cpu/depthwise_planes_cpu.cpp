// The float32 NCHW depthwise forward and input gradient as planes of sums in vector registers.
//
// Each target pixel is a sum of terms, products of a weight and a source pixel shifted from it:
// the forward's target pixel (oh, ow) sums its taps, in (ki, kj) order; the input gradient's pixel
// (ih, iw) the taps that reach it from the output gradient, in (ki, kj) order. Those are the orders
// of the tap-by-tap loops of depthwise_cpu.cpp (and of the NHWC and CUDA kernels), each product
// one multiply-add from zero, so these give their bits. Here a pixel's sum stays in a register
// across its terms, a vector of pixels at a time, where the tap-by-tap loops load and store an
// accumulator around every product: 0.33-0.41x their time at stride 1 (benchmarks/NOTES.md,
// section 87). A stride along the rows becomes unit-stride reads: the forward reads the phases
// of the input's rows (their columns of one residue of the stride, copied once per plane), the
// input gradient computes its pixels phase by phase (section 88); at stride 2 those copies and
// the spread of the phases onto the plane move two vectors at a time (section 125).
#include "depthwise_planes_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "../summation.h"
#include "../taps.h"
#include "cpu_kernels.h"
#include "vector_ops.h"

namespace torch_convbp {
namespace {

// A 3x3 plane read as a correlation: target pixel (r, c) reads, at tap (ki, kj), the source
// pixel (r * row_stride + row_base + ki * row_step, c + column_base + kj * column_step), where
// that lies inside the source. The forward reads the input so; the stride-1 input gradient reads
// the output gradient so, its taps mirrored (negative steps).
struct Correlation {
  int64_t source_height, source_width, target_height, target_width;
  int64_t row_stride, row_base, row_step, column_base, column_step;
};

// One 3x3 plane: target = the sum over each pixel's taps inside the source, in (ki, kj) order from
// zero, each product one multiply-add: the tap-by-tap loops' products in their order, so their
// bits. Compiled for the target of Ops (run_compiled_for). The pixels whose nine taps all lie
// inside (the inner columns of the rows whose kernel rows all do) a vector at a time, the nine
// weights and the sum in registers; where those columns do not fill the last vector, it overlaps
// the one before, whose pixels it writes again with the same bits. The border pixels one by one.
struct PlaneOfVectors {
  template <class Ops>
  static TORCH_CONVBP_INLINE void run(const float* source, const float* w, float* target,
                                      const Correlation& c) {
    using V = typename Vector<float, Ops::kBytes>::type;
    constexpr int64_t lanes = Vector<float, Ops::kBytes>::lanes;
    int64_t offsets[3];
    int64_t inner_begin = 0, inner_end = c.target_width;  // the columns every tap reads inside
    for (int kj = 0; kj < 3; ++kj) {
      offsets[kj] = c.column_base + kj * c.column_step;
      const Span inside = valid_columns(offsets[kj], 1, c.source_width, c.target_width);
      inner_begin = std::max(inner_begin, inside.begin);
      inner_end = std::min(inner_end, inside.end);
    }
    V weights[9];
    for (int t = 0; t < 9; ++t) weights[t] = Ops::template splat<V>(w[t]);
    for (int64_t r = 0; r < c.target_height; ++r) {
      const float* rows[3];
      bool every_row = true;
      for (int ki = 0; ki < 3; ++ki) {
        const int64_t row = r * c.row_stride + c.row_base + ki * c.row_step;
        const bool inside = row >= 0 && row < c.source_height;
        rows[ki] = inside ? source + row * c.source_width : nullptr;
        every_row = every_row && inside;
      }
      float* out = target + r * c.target_width;
      // the pixels [begin, end) in vectors
      const bool vectors = every_row && inner_end - inner_begin >= lanes;
      const int64_t begin = vectors ? inner_begin : 0, end = vectors ? inner_end : 0;
      for (int64_t col = begin; col < end; col += lanes) {
        const int64_t at = std::min(col, end - lanes);
        V sum = Ops::template splat<V>(0.0f);
        for (int ki = 0; ki < 3; ++ki) {
          for (int kj = 0; kj < 3; ++kj) {
            V x;
            std::memcpy(&x, rows[ki] + at + offsets[kj], sizeof(V));
            sum = Ops::multiply_add(weights[ki * 3 + kj], x, sum);
          }
        }
        std::memcpy(out + at, &sum, sizeof(V));
      }
      one_by_one(rows, offsets, w, out, c.source_width, 0, begin);
      one_by_one(rows, offsets, w, out, c.source_width, end, c.target_width);
    }
  }

  // The pixels [first, last) of a row: each tap inside the source (rows[ki] null for a kernel
  // row outside), in (ki, kj) order.
  static TORCH_CONVBP_INLINE void one_by_one(const float* const* rows, const int64_t* offsets,
                                             const float* w, float* out, int64_t source_width,
                                             int64_t first, int64_t last) {
    for (int64_t col = first; col < last; ++col) {
      float sum = 0;
      for (int ki = 0; ki < 3; ++ki) {
        if (rows[ki] == nullptr) continue;
        for (int kj = 0; kj < 3; ++kj) {
          const int64_t at = col + offsets[kj];
          if (at >= 0 && at < source_width) sum = multiply_add(w[ki * 3 + kj], rows[ki][at], sum);
        }
      }
      out[col] = sum;
    }
  }
};

constexpr int kMaxTerms = 9;

// One term of a plane of sums: it reads the source plane sources[source] (`width` columns), at the
// target pixel (r, c) its pixel (r * row_stride + row_offset, c + column_offset), times the
// weight w[tap]; `inside` are the target columns at which that column lies in the source.
struct Term {
  int source, tap;
  int64_t width, row_offset, column_offset;
  Span inside;
};

// The rows [first, last) of a target plane whose terms read inside the same source rows: the
// rows within the kernel's reach of the top and bottom edges have fewer than the others. Their
// terms in order.
struct Band {
  int64_t first = 0, last = 0;
  int count = 0;
  int term[kMaxTerms];
};

// A plane of sums, the same for every plane of a call (whose sources and weights are given
// plane by plane): target pixel (r, c) is the sum, in the order of `terms` and from zero, of its
// terms that read inside their source (source_height rows, each term's width columns). add() the
// terms, then split() the rows into bands.
struct TermPlane {
  Term terms[kMaxTerms];
  int count = 0;
  int64_t source_height, row_stride, target_height, target_width;
  std::vector<Band> bands;

  void add(int source, int tap, int64_t width, int64_t row_offset, int64_t column_offset) {
    terms[count++] = {source,        tap,
                      width,         row_offset,
                      column_offset, valid_columns(column_offset, 1, width, target_width)};
  }

  void split() {
    for (int64_t r = 0; r < target_height; ++r) {
      Band row{r, r + 1};
      for (int t = 0; t < count; ++t) {
        const int64_t source_row = r * row_stride + terms[t].row_offset;
        if (source_row >= 0 && source_row < source_height) row.term[row.count++] = t;
      }
      if (!bands.empty() && bands.back().count == row.count &&
          std::equal(row.term, row.term + row.count, bands.back().term)) {
        bands.back().last = r + 1;
      } else {
        bands.push_back(row);
      }
    }
  }
};

// A TermPlane into target [target_height, target_width], compiled for the target of Ops
// (run_compiled_for), band by band. (At stride 1 this took 1.15-1.33x the time of the 3x3
// correlation's PlaneOfVectors above, which the stride-1 planes keep: benchmarks/NOTES.md,
// section 88.)
struct TermPlaneOfVectors {
  template <class Ops>
  static TORCH_CONVBP_INLINE void run(const TermPlane& p, const float* const* sources,
                                      const float* w, float* target) {
    for (const Band& band : p.bands) band_of_rows<Ops>(p, band, sources, w, target);
  }

  // The rows [first, last) of a band. The pixels at which all of its terms read inside a vector
  // at a time, the Count terms unrolled, their weights and the sum in registers: with a loop over
  // the terms, their weights and sources stayed in memory, 2x the time (benchmarks/NOTES.md,
  // section 88). Where those columns do not fill the last vector, it overlaps the one before,
  // whose pixels it writes again with the same bits. The other pixels one by one.
  template <class Ops, int Count = kMaxTerms>
  static TORCH_CONVBP_INLINE void band_of_rows(const TermPlane& p, const Band& band,
                                               const float* const* sources, const float* w,
                                               float* target) {
    if constexpr (Count > 0) {
      if (band.count < Count) return band_of_rows<Ops, Count - 1>(p, band, sources, w, target);
    }
    using V = typename Vector<float, Ops::kBytes>::type;
    constexpr int64_t lanes = Vector<float, Ops::kBytes>::lanes;
    constexpr int n = Count > 0 ? Count : 1;
    float weight[n];
    int64_t offset[n], width[n], row_step[n];
    const float* at[n];  // each term's source row, shifted by its column offset
    V weights[n];
    int64_t inner_begin = 0, inner_end = p.target_width;  // the columns they all read inside
    for (int k = 0; k < Count; ++k) {
      const Term& term = p.terms[band.term[k]];
      weight[k] = w[term.tap];
      offset[k] = term.column_offset;
      width[k] = term.width;
      row_step[k] = p.row_stride * term.width;
      at[k] = sources[term.source] + (band.first * p.row_stride + term.row_offset) * term.width +
              term.column_offset;
      weights[k] = Ops::template splat<V>(weight[k]);
      inner_begin = std::max(inner_begin, term.inside.begin);
      inner_end = std::min(inner_end, term.inside.end);
    }
    const bool vectors = inner_end - inner_begin >= lanes;
    const int64_t begin = vectors ? inner_begin : 0, end = vectors ? inner_end : 0;
    for (int64_t r = band.first; r < band.last; ++r) {
      if (r > band.first) {
        for (int k = 0; k < Count; ++k) at[k] += row_step[k];
      }
      float* out = target + r * p.target_width;
      for (int64_t col = begin; col < end; col += lanes) {
        const int64_t from = std::min(col, end - lanes);
        V sum = Ops::template splat<V>(0.0f);
#pragma GCC unroll 9
        for (int k = 0; k < Count; ++k) {
          V x;
          std::memcpy(&x, at[k] + from, sizeof(V));
          sum = Ops::multiply_add(weights[k], x, sum);
        }
        std::memcpy(out + from, &sum, sizeof(V));
      }
      // the other pixels one by one, each term where its column lies inside, without a branch: its
      // product is taken at a column clamped inside, then kept or not
      for (const Span part : {Span{0, begin}, Span{end, p.target_width}}) {
        for (int64_t col = part.begin; col < part.end; ++col) {
          float sum = 0;
#pragma GCC unroll 9
          for (int k = 0; k < Count; ++k) {
            const int64_t source_col = col + offset[k];
            const bool inside = source_col >= 0 && source_col < width[k];
            const int64_t read =
                std::clamp<int64_t>(source_col, 0, std::max<int64_t>(width[k] - 1, 0));
            const float term = multiply_add(weight[k], at[k][read - offset[k]], sum);
            sum = inside ? term : sum;
          }
          out[col] = sum;
        }
      }
    }
  }
};

// Runs plane(p, scratch, ops) for the planes [0, planes) in parallel, where scratch is the task's
// buffer and ops the CPU's widest vector operations (with_vector_ops), for run_compiled_for.
template <class Plane>
void in_parallel(int64_t planes, int64_t work_per_plane, Plane plane) {
  with_vector_ops([&](auto ops) {
    at::parallel_for(0, planes, grain_for(work_per_plane), [&](int64_t begin, int64_t end) {
      std::vector<float> scratch;
      for (int64_t p = begin; p < end; ++p) plane(p, scratch, ops);
    });
  });
}

// Of `width` columns, how many are p, p + stride, p + 2 stride, ...: the width of a phase.
int64_t phase_width(int64_t width, int64_t stride, int64_t p) {
  return width > p ? (width - p + stride - 1) / stride : 0;
}

// Rows' columns at stride 2, split into their two phases and put together again, two vectors at a
// time with one permutation for each result vector: the forward's copy of the input's phases
// and the input gradient's spread of its phases onto the plane took a scalar load or store per
// pixel, most of those kernels' time at stride 2 (benchmarks/NOTES.md, section 125). Copies: no
// value changes. Compiled for the target of Ops (run_compiled_for).
template <class Ops>
struct ColumnPairs {
  using V = typename Vector<float, Ops::kBytes>::type;
  static constexpr int lanes = int(Vector<float, Ops::kBytes>::lanes);

  // even[c] = row[2c] and odd[c] = row[2c + 1], over the row's `width` columns.
  static TORCH_CONVBP_INLINE void split(const float* row, int64_t width, float* even, float* odd) {
    int64_t c = 0;
    for (; 2 * (c + lanes) <= width; c += lanes) {
      V a, b;
      std::memcpy(&a, row + 2 * c, sizeof(V));
      std::memcpy(&b, row + 2 * c + lanes, sizeof(V));
      const V evens = every_other(a, b, Lanes{}, 0), odds = every_other(a, b, Lanes{}, 1);
      std::memcpy(even + c, &evens, sizeof(V));
      std::memcpy(odd + c, &odds, sizeof(V));
    }
    for (; 2 * c < width; ++c) {
      even[c] = row[2 * c];
      if (2 * c + 1 < width) odd[c] = row[2 * c + 1];
    }
  }

  // row[2c] = even[c] and row[2c + 1] = odd[c], over the row's `width` columns.
  static TORCH_CONVBP_INLINE void merge(const float* even, const float* odd, int64_t width,
                                        float* row) {
    int64_t c = 0;
    for (; 2 * (c + lanes) <= width; c += lanes) {
      V a, b;
      std::memcpy(&a, even + c, sizeof(V));
      std::memcpy(&b, odd + c, sizeof(V));
      const V low = alternately(a, b, Lanes{}, 0), high = alternately(a, b, Lanes{}, lanes / 2);
      std::memcpy(row + 2 * c, &low, sizeof(V));
      std::memcpy(row + 2 * c + lanes, &high, sizeof(V));
    }
    for (; 2 * c < width; ++c) {
      row[2 * c] = even[c];
      if (2 * c + 1 < width) row[2 * c + 1] = odd[c];
    }
  }

 private:
  using Lanes = std::make_integer_sequence<int, lanes>;
  // Lanes first, first + 2, first + 4, ... of a followed by b (first 0 or 1).
  template <int... L>
  static TORCH_CONVBP_INLINE V every_other(V a, V b, std::integer_sequence<int, L...>, int first) {
    return first == 0 ? pick<(2 * L)...>(a, b) : pick<(2 * L + 1)...>(a, b);
  }
  // a[from], b[from], a[from + 1], b[from + 1], ... (from 0 or lanes / 2).
  template <int... L>
  static TORCH_CONVBP_INLINE V alternately(V a, V b, std::integer_sequence<int, L...>, int from) {
    return from == 0 ? pick<(L / 2 + L % 2 * lanes)...>(a, b)
                     : pick<(lanes / 2 + L / 2 + L % 2 * lanes)...>(a, b);
  }
  // The lanes Pick... of a followed by b (GCC before 12 has only __builtin_shuffle).
  template <int... Pick>
  static TORCH_CONVBP_INLINE V pick(V a, V b) {
#if defined(__clang__) || __GNUC__ >= 12
    return __builtin_shufflevector(a, b, Pick...);
#else
    using Lanes32 = typename Vector<int32_t, Ops::kBytes>::type;
    return __builtin_shuffle(a, b, Lanes32{Pick...});
#endif
  }
};

// The rows of a plane [rows, width] split into its even and odd columns, each phase's rows
// adjacent, for run_compiled_for.
struct SplitColumns {
  template <class Ops>
  static TORCH_CONVBP_INLINE void run(const float* plane, int64_t rows, int64_t width, float* even,
                                      float* odd) {
    const int64_t even_width = phase_width(width, 2, 0), odd_width = phase_width(width, 2, 1);
    for (int64_t r = 0; r < rows; ++r) {
      ColumnPairs<Ops>::split(plane + r * width, width, even + r * even_width, odd + r * odd_width);
    }
  }
};

// The even and odd columns of `rows` rows of `width` columns put together into those rows of a
// plane, `row_step` apart, for run_compiled_for.
struct MergeColumns {
  template <class Ops>
  static TORCH_CONVBP_INLINE void run(const float* even, const float* odd, int64_t rows,
                                      int64_t width, float* plane, int64_t row_step) {
    const int64_t even_width = phase_width(width, 2, 0), odd_width = phase_width(width, 2, 1);
    for (int64_t r = 0; r < rows; ++r) {
      ColumnPairs<Ops>::merge(even + r * even_width, odd + r * odd_width, width,
                              plane + r * row_step);
    }
  }
};

// The forward: tap (ki, kj) of output pixel (oh, ow) reads input pixel (oh * stride_h - pad_h +
// ki * dilation_h, ow * stride_w + q), q = kj * dilation_w - pad_w: with stride_w > 1, column
// ow + q / stride_w (rounded down) of the row's phase q mod stride_w. The sources are those
// phases, one per residue that some tap reads.
struct ForwardPlanes {
  TermPlane terms;
  int64_t residues[kMaxTerms];  // source i is the phase residues[i]
  int phases = 0;

  explicit ForwardPlanes(const ConvShape& s) {
    terms.source_height = s.height;
    terms.row_stride = s.stride_h;
    terms.target_height = s.out_height;
    terms.target_width = s.out_width;
    const int64_t stride = s.stride_w;
    for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
        const int64_t q = input_index(int64_t{0}, int64_t{1}, s.pad_w, kj, s.dilation_w);
        const int64_t residue = floor_mod(q, stride);
        const int source = int(std::find(residues, residues + phases, residue) - residues);
        if (source == phases) residues[phases++] = residue;
        terms.add(source, int(ki * s.kernel_w + kj), phase_width(s.width, stride, residue),
                  input_index(int64_t{0}, int64_t{1}, s.pad_h, ki, s.dilation_h),
                  floor_div(q, stride));
      }
    }
    terms.split();
  }

  // The sources of the input plane x [H, W]: its phases, copied into scratch (both phases of
  // stride 2 by SplitColumns, compiled for the target of ops).
  template <class Ops>
  void sources(const float* x, const ConvShape& s, std::vector<float>& scratch, const float** out,
               Ops ops) const {
    const int64_t phase_size = s.height * phase_width(s.width, s.stride_w, 0);  // the widest
    scratch.resize(phases * phase_size);
    for (int i = 0; i < phases; ++i) out[i] = scratch.data() + i * phase_size;
    if (s.stride_w == 2 && phases == 2) {
      const int even = residues[0] == 0 ? 0 : 1;
      return run_compiled_for<SplitColumns>(ops, x, s.height, s.width,
                                            scratch.data() + even * phase_size,
                                            scratch.data() + (1 - even) * phase_size);
    }
    for (int i = 0; i < phases; ++i) {
      float* phase = scratch.data() + i * phase_size;
      const int64_t width = phase_width(s.width, s.stride_w, residues[i]);
      for (int64_t row = 0; row < s.height; ++row) {
        const float* x_row = x + row * s.width + residues[i];
        for (int64_t c = 0; c < width; ++c) phase[row * width + c] = x_row[c * s.stride_w];
      }
    }
  }
};

// The input gradient, one output channel per input channel, phase by phase: its pixels (ih, iw) =
// (i * stride_h + rh, j * stride_w + rw) of phase (rh, rw), a plane over (i, j). Tap (ki, kj)
// reaches input row ih from output row oh where oh * stride_h = ih + pad_h - ki * dilation_h
// (OutputIndexByTap, taps.h): for the first row of the phase, ih = rh, at oh = out where the
// remainder is 0, and one output row on for each row of the phase; at no row of it where the
// remainder is not 0. Likewise the columns. The one source is the output gradient's plane.
TermPlane input_grad_phase(const ConvShape& s, int64_t rh, int64_t rw) {
  TermPlane p;
  p.source_height = s.out_height;
  p.row_stride = 1;
  p.target_height = phase_width(s.height, s.stride_h, rh);
  p.target_width = phase_width(s.width, s.stride_w, rw);
  OutputIndexByTap<int64_t> row(rh, s.pad_h, s.dilation_h, s.stride_h);
  for (int64_t ki = 0; ki < s.kernel_h; ++ki, row.next()) {
    if (row.rest != 0) continue;
    OutputIndexByTap<int64_t> column(rw, s.pad_w, s.dilation_w, s.stride_w);
    for (int64_t kj = 0; kj < s.kernel_w; ++kj, column.next()) {
      if (column.rest == 0) p.add(0, int(ki * s.kernel_w + kj), s.out_width, row.out, column.out);
    }
  }
  p.split();
  return p;
}

// A 3x3 kernel read with stride 1 along the rows: the correlation's PlaneOfVectors.
bool correlation_of_rows(const ConvShape& s) {
  return s.kernel_h == 3 && s.kernel_w == 3 && s.stride_w == 1;
}

}  // namespace

bool vector_planes_take_forward(const ConvShape& s) {
  return correlation_of_rows(s) || (s.stride_w > 1 && s.kernel_h * s.kernel_w <= kMaxTerms);
}

bool vector_planes_take_input_grad(const ConvShape& s) {
  const bool strided = s.stride_h > 1 || s.stride_w > 1;
  return s.out_channels == s.in_channels &&
         (strided ? s.kernel_h * s.kernel_w <= kMaxTerms : correlation_of_rows(s));
}

// output[n, o] from input[n, o / m], the multiplier m = Cout / C: a correlation of the rows at
// stride_w 1, else planes of terms over the rows' phases.
void vector_planes_forward(const float* input, const float* weight, float* output,
                           const ConvShape& s) {
  const int64_t m = s.out_channels / s.in_channels, taps = s.kernel_h * s.kernel_w;
  const int64_t out_plane = s.out_height * s.out_width;
  const auto input_plane = [&](int64_t plane) {  // (n, o) reads the input's plane (n, o / m)
    const int64_t n = plane / s.out_channels, o = plane % s.out_channels;
    return input + (n * s.in_channels + o / m) * s.height * s.width;
  };
  const auto weights = [&](int64_t plane) { return weight + plane % s.out_channels * taps; };
  if (correlation_of_rows(s)) {
    const Correlation c{s.height, s.width,      s.out_height, s.out_width, s.stride_h,
                        -s.pad_h, s.dilation_h, -s.pad_w,     s.dilation_w};
    return in_parallel(s.batch * s.out_channels, out_plane * taps,
                       [&](int64_t plane, auto&, auto ops) {
                         run_compiled_for<PlaneOfVectors>(ops, input_plane(plane), weights(plane),
                                                          output + plane * out_plane, c);
                       });
  }
  const ForwardPlanes planes(s);
  in_parallel(s.batch * s.out_channels, out_plane * taps,
              [&](int64_t plane, auto& scratch, auto ops) {
                const float* sources[kMaxTerms];
                planes.sources(input_plane(plane), s, scratch, sources, ops);
                run_compiled_for<TermPlaneOfVectors>(ops, planes.terms, sources, weights(plane),
                                                     output + plane * out_plane);
              });
}

// The stride_w phases of `rows` rows of an input-gradient plane, `phase_size` apart in `phases`,
// onto those rows of the plane, the first at `first_row` and stride_h rows apart.
template <class Ops>
void spread_phases(const float* phases, int64_t phase_size, int64_t rows, const ConvShape& s,
                   float* first_row, Ops ops) {
  const int64_t row_step = s.stride_h * s.width;
  if (s.stride_w == 2) {
    return run_compiled_for<MergeColumns>(ops, phases, phases + phase_size, rows, s.width,
                                          first_row, row_step);
  }
  for (int64_t rw = 0; rw < s.stride_w; ++rw) {
    const float* phase = phases + rw * phase_size;
    const int64_t width = phase_width(s.width, s.stride_w, rw);
    for (int64_t i = 0; i < rows; ++i) {
      float* row = first_row + i * row_step + rw;
      for (int64_t j = 0; j < width; ++j) row[j * s.stride_w] = phase[i * width + j];
    }
  }
}

// grad_input[n, c] from grad_output[n, c]: at stride 1 a correlation of dY's rows, its taps
// mirrored; strided, phase by phase, each summed in scratch and spread to its pixels.
void vector_planes_input_grad(const float* grad_output, const float* weight, float* grad_input,
                              const ConvShape& s) {
  const int64_t taps = s.kernel_h * s.kernel_w, out_plane = s.out_height * s.out_width;
  const int64_t plane_size = s.height * s.width;
  if (correlation_of_rows(s) && s.stride_h == 1) {
    // input pixel (ih, iw) reads dY at (ih + pad_h - ki d_h, iw + pad_w - kj d_w)
    const Correlation c{s.out_height, s.out_width,   s.height, s.width,      1,
                        s.pad_h,      -s.dilation_h, s.pad_w,  -s.dilation_w};
    return in_parallel(s.batch * s.in_channels, out_plane * taps,
                       [&](int64_t plane, auto&, auto ops) {
                         run_compiled_for<PlaneOfVectors>(ops, grad_output + plane * out_plane,
                                                          weight + plane % s.in_channels * taps,
                                                          grad_input + plane * plane_size, c);
                       });
  }
  std::vector<TermPlane> phases;
  for (int64_t rh = 0; rh < s.stride_h; ++rh) {
    for (int64_t rw = 0; rw < s.stride_w; ++rw) phases.push_back(input_grad_phase(s, rh, rw));
  }
  const int64_t largest_phase = phases[0].target_height * phases[0].target_width;
  in_parallel(s.batch * s.in_channels, out_plane * taps,
              [&](int64_t plane, auto& scratch, auto ops) {
                const float* dy = grad_output + plane * out_plane;
                const float* w = weight + plane % s.in_channels * taps;
                float* grad = grad_input + plane * plane_size;
                scratch.resize(s.stride_w * largest_phase);
                for (int64_t rh = 0; rh < s.stride_h; ++rh) {
                  // the phases of the rows rh, rh + stride_h, ...: summed, then spread onto them
                  for (int64_t rw = 0; rw < s.stride_w; ++rw) {
                    run_compiled_for<TermPlaneOfVectors>(ops, phases[rh * s.stride_w + rw], &dy, w,
                                                         scratch.data() + rw * largest_phase);
                  }
                  spread_phases(scratch.data(), largest_phase,
                                phases[rh * s.stride_w].target_height, s, grad + rh * s.width, ops);
                }
              });
}

}  // namespace torch_convbp
