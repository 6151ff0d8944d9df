// How one call cuts its work, and the scratch memory each piece uses (plan.cpp).
//
// The rule that makes the results the same on any thread count: the cut (chunks, GEMM blocks,
// weight-gradient partial sums) depends on the sizes and the workspace limit alone. The thread
// count only decides who runs which piece, and every piece computes the same bits whichever
// thread runs it (its GEMMs are single-threaded: gemm.h).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>

#include <algorithm>

#include "matrices.h"
#include "shape.h"

namespace torch_convbp {

using at::IntArrayRef;
using at::Tensor;

// The largest column buffer (plus GEMM staging) one call may allocate, in bytes.
void set_workspace_limit(int64_t bytes);
int64_t workspace_limit();
// The most workspace held at once (all calls, all threads) since the last reset, in bytes;
// reset=true returns it and starts a new count.
int64_t workspace_peak(bool reset);

// A chunk of the work: `images` whole images from `image` on and, of each, output rows
// [row, row + rows) (of a 3-D convolution's output, its depth slices' rows counted together:
// shape.h). Several images are taken only with all their rows.
struct Chunk {
  int64_t image, images, row, rows;
};

// The chunks of a call, in a fixed order: image chunk by image chunk, and the row bands of each
// in order. Chunk index i is image chunk i / bands, band i % bands.
struct Plan {
  int64_t images, rows;         // per chunk; rows < output_rows() only when images == 1
  int64_t image_chunks, bands;  // ceil(batch / images), ceil(output_rows() / rows)
  int64_t lanes_that_fit;       // how many chunks' workspaces fit the limit at once (>= 1)

  int64_t chunks() const { return image_chunks * bands; }
  Chunk chunk(const ConvShape& s, int64_t index) const {
    const int64_t image = index / bands * images, row = index % bands * rows;
    return {image, std::min(images, s.batch - image), row, std::min(rows, s.output_rows() - row)};
  }
};

// Chooses the chunks for a call whose workspace has these options (dtype, device): about
// target_chunk_pixels() output pixels each, within the workspace limit. `pixels_contracted`: the
// pixels are the GEMM's inner dimension (grad-weight), not its output width.
Plan plan_chunks(const ConvShape& s, at::TensorOptions workspace, bool pixels_contracted = false);

// The number of weight-gradient partial sums: a fixed number, by the sizes (the chunks are dealt
// to them in contiguous runs; each sums its chunks in order, and they are summed in order).
int64_t partial_sums(const Plan& plan, at::TensorOptions workspace);

// One lane's scratch memory, allocated on first use and reused by every chunk the lane runs: the
// column matrix and a staging area for GEMM operands that are not views, both laid out for the
// call's layout (matrices.h). Counted against the workspace limit's bookkeeping (workspace_peak).
class Workspace {
 public:
  Workspace(const ConvShape& s, int64_t max_pixels, at::TensorOptions options, Layout layout)
      : shape_(s), max_pixels_(max_pixels), options_(options), layout_(layout) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();

  at::ScalarType dtype() const { return options_.dtype().toScalarType(); }
  // The [G, Cin/G*kh*kw, pixels] column matrix.
  Tensor columns(int64_t pixels);
  // A staging chunk of `size` [n, C, h, w] (staging_chunk in matrices.h), in the workspace's
  // dtype, or in `dtype`.
  Tensor staging(IntArrayRef size);
  Tensor staging(IntArrayRef size, at::ScalarType dtype);
  // `chunk` [n, C, h, w] as the GEMM operand [G, C/G, n*h*w]: a view, or a copy (converted to
  // the workspace's dtype, or to `dtype`: an operand of GEMMs whose results, the columns, are
  // float32) in staging.
  Tensor group_matrix(const Tensor& chunk);
  Tensor group_matrix(const Tensor& chunk, at::ScalarType dtype);

 private:
  Tensor& take(Tensor& buffer, int64_t rows, at::ScalarType dtype);
  const ConvShape& shape_;
  int64_t max_pixels_;
  at::TensorOptions options_;
  Layout layout_;
  Tensor columns_, staging_;
  int64_t held_bytes_ = 0;
};

// Scratch memory a route allocates itself, outside a Workspace, counted with the workspaces
// (workspace_peak) while this lives.
class CountedScratch {
 public:
  explicit CountedScratch(const Tensor& scratch);
  CountedScratch(const CountedScratch&) = delete;
  CountedScratch& operator=(const CountedScratch&) = delete;
  ~CountedScratch();

 private:
  int64_t bytes_;
};

// Runs body(unit, workspace) for every unit in [0, units), each unit once, its chunks in its own
// order. Units are independent pieces of work (chunks, image chunks, partial sums). On the CPU
// they are dealt to lanes, min(threads, units, plan.lanes_that_fit) of them, which run in
// parallel, each with its own workspace: lane l takes units l, l + lanes, .... With one lane the
// units run in order on the calling thread, and the GEMMs' blocks are what runs in parallel.
template <class Body>
void run_units(const ConvShape& s, const Plan& plan, int64_t units, at::TensorOptions workspace,
               Layout layout, Body&& body) {
  const int64_t threads = workspace.device().is_cpu() ? at::get_num_threads() : 1;
  const int64_t lanes = std::max<int64_t>(1, std::min({threads, units, plan.lanes_that_fit}));
  const int64_t max_pixels = plan.images * plan.rows * s.out_width;
  auto run_lane = [&](int64_t lane) {
    Workspace ws(s, max_pixels, workspace, layout);
    for (int64_t unit = lane; unit < units; unit += lanes) body(unit, ws);
  };
  if (lanes == 1) {
    run_lane(0);
    return;
  }
  // The worker threads run the ATen ops as the caller would (below autograd, same modes).
  const at::ThreadLocalState caller_state;
  at::parallel_for(0, lanes, 1, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard guard(caller_state);
    for (int64_t lane = begin; lane < end; ++lane) run_lane(lane);
  });
}

}  // namespace torch_convbp
