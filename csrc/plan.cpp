// The plan of a call (chunks, lanes, partial sums) and its workspace, with the workspace limit.
#include "plan.h"

#include <atomic>
#include <cstdlib>

#include "scratch.h"

namespace torch_convbp {
namespace {

std::atomic<int64_t> g_workspace_limit{int64_t{1} << 30};  // 1 GiB; see set_workspace_limit
std::atomic<int64_t> g_workspace_in_use{0};  // bytes held by live Workspaces, all threads
std::atomic<int64_t> g_workspace_peak{0};    // the most held at once since the last reset

// How many output pixels a chunk aims at. Two pulls: a GEMM narrower than about 512 columns is
// thin (MKL and cuBLAS lose speed), and a column matrix much larger than a cache-sized tile
// (2.5 MiB: it fits the L2/L3 share of a core) is written by im2col to memory and read back by
// the GEMM, instead of staying in cache between the two. So small images are batched side by
// side up to the target, and large ones are cut into row bands of about the target (see
// benchmarks/NOTES.md for the measurements). On a GPU, whose GEMMs want to be far wider and
// whose caches are not the point, a chunk aims at 256Ki pixels (a sweep on an H100 found a wide
// optimum: NOTES section 12). TORCH_CONVBP_CHUNK_PIXELS fixes the target, for tuning.
constexpr int64_t kMinGemmWidth = 512;
constexpr int64_t kColumnTileBytes = int64_t{5} << 19;  // 2.5 MiB
int64_t target_chunk_pixels(int64_t column_bytes_per_pixel, bool cpu) {
  static const int64_t fixed = [] {
    const char* text = std::getenv("TORCH_CONVBP_CHUNK_PIXELS");
    return text ? std::max<int64_t>(0, std::atoll(text)) : int64_t{0};
  }();
  if (fixed > 0) return fixed;
  if (!cpu) return int64_t{1} << 18;
  return std::max(kMinGemmWidth, kColumnTileBytes / std::max<int64_t>(column_bytes_per_pixel, 1));
}

// A chunk may take a quarter of the workspace limit on the CPU, so that at least 4 lanes fit in
// it at once (the whole limit on a GPU, which runs one lane). A constant, not the thread count:
// the chunks must not depend on the threads.
constexpr int64_t kLanesInLimit = 4;
// The number of chunks is rounded up to a multiple of this (more image chunks, or more bands of
// an image where the batch is odd), so that 2 or 4 lanes get equal shares (measured: an odd
// chunk count left a core idle for a third of a call on the 2-core machine).
constexpr int64_t kChunkMultiple = 2;
// The most weight-gradient partial sums (each a float32 copy of the weight while the call runs).
constexpr int64_t kMaxPartialSums = 4;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Adds `bytes` to the workspace in use, and raises the peak to it.
void count_in_use(int64_t bytes) {
  const int64_t in_use = g_workspace_in_use += bytes;
  int64_t peak = g_workspace_peak.load();
  while (in_use > peak && !g_workspace_peak.compare_exchange_weak(peak, in_use)) {
  }
}

}  // namespace

// Chooses the chunks: about target_chunk_pixels() output pixels each (whole images side by side,
// or row bands of one image), as long as their column matrix plus staging (a column of each per
// output pixel, in the workspace's dtype) fit the chunk's share of the workspace limit; one
// output row at the least, whatever the limit. Nothing here reads the thread count.
Plan plan_chunks(const ConvShape& s, at::TensorOptions workspace, bool pixels_contracted) {
  const bool cpu = workspace.device().is_cpu();
  const int64_t element_size = static_cast<int64_t>(workspace.dtype().itemsize());
  const int64_t bytes_per_pixel = (s.column_rows() + s.out_channels) * element_size;
  const int64_t limit_pixels = g_workspace_limit.load() / bytes_per_pixel;
  const int64_t chunk_budget = std::max(s.out_width, limit_pixels / (cpu ? kLanesInLimit : 1));
  const int64_t image_pixels = s.output_rows() * s.out_width;
  const int64_t batch = std::max<int64_t>(s.batch, 1);
  // A pointwise convolution takes one whole image at a time when that makes a good GEMM: then
  // its input is its column matrix and its output the GEMM's destination, with no copy at all
  // (the lanes keep the threads busy). That is when an image is wide enough, or when the pixels
  // are the GEMM's inner dimension, whose length matters little (NOTES section 3). Other
  // images are batched like any other layer's. Not on a GPU: there a GEMM per image is far too
  // small (its launch and host overhead dominate) and a grad-weight GEMM per image, whose
  // result is only Cout x Cin, fills few of the multiprocessors (NOTES section 12).
  const bool whole_images =
      cpu && s.is_pointwise() && (pixels_contracted || image_pixels >= kMinGemmWidth);
  const int64_t target = std::min(
      chunk_budget,
      whole_images ? image_pixels : target_chunk_pixels(s.column_rows() * element_size, cpu));
  Plan plan{};
  if (image_pixels > chunk_budget || image_pixels > 2 * target) {
    // Row bands of one image, of about the target's width, when a whole image is over the
    // chunk's memory budget or over twice the target.
    int64_t bands = ceil_div(image_pixels, target);
    if (cpu && bands > 1 && s.batch * bands % kChunkMultiple != 0) {
      bands = ceil_div(bands, kChunkMultiple) * kChunkMultiple;  // an even chunk count
    }
    plan.images = 1;
    plan.rows = std::max<int64_t>(
        1, std::min(chunk_budget / s.out_width, ceil_div(s.output_rows(), bands)));
  } else {
    const int64_t wanted = ceil_div(target, image_pixels);
    plan.images = std::clamp<int64_t>(std::min(wanted, chunk_budget / image_pixels), 1, batch);
    int64_t chunks = ceil_div(batch, plan.images);
    if (cpu && chunks > 1) {  // equal shares for 2 (or 4) lanes
      chunks = ceil_div(chunks, kChunkMultiple) * kChunkMultiple;
      plan.images = ceil_div(batch, chunks);
    }
    plan.rows = s.output_rows();
  }
  plan.image_chunks = ceil_div(s.batch, plan.images);  // 0 for an empty batch
  plan.bands = ceil_div(std::max<int64_t>(s.output_rows(), 1), plan.rows);
  const int64_t chunk_pixels = plan.images * plan.rows * s.out_width;
  plan.lanes_that_fit = std::max<int64_t>(1, limit_pixels / std::max<int64_t>(chunk_pixels, 1));
  return plan;
}

int64_t partial_sums(const Plan& plan, at::TensorOptions workspace) {
  return workspace.device().is_cpu() ? std::min(plan.chunks(), kMaxPartialSums) : 1;
}

Workspace::~Workspace() { g_workspace_in_use -= held_bytes_; }

Tensor Workspace::columns(int64_t pixels) {
  return column_matrix(take(columns_, shape_.column_rows(), dtype()), shape_, pixels, layout_);
}

Tensor Workspace::staging(IntArrayRef size) { return staging(size, dtype()); }

Tensor Workspace::staging(IntArrayRef size, at::ScalarType dtype) {
  return staging_chunk(take(staging_, size[1], dtype), size, layout_);
}

Tensor Workspace::group_matrix(const Tensor& chunk) { return group_matrix(chunk, dtype()); }

Tensor Workspace::group_matrix(const Tensor& chunk, at::ScalarType dtype) {
  if (auto view = group_matrix_view(chunk, shape_.groups, dtype, layout_)) return *view;
  Tensor staged = staging(chunk.sizes(), dtype);
  staged.copy_(chunk);
  return *group_matrix_view(staged, shape_.groups, dtype, layout_);
}

// The buffer, allocated on first use in `dtype`: a lane's chunks ask for one dtype each. Never
// wider than the workspace's, which plan_chunks counted.
Tensor& Workspace::take(Tensor& buffer, int64_t rows, at::ScalarType dtype) {
  TORCH_INTERNAL_ASSERT(c10::elementSize(dtype) <= options_.dtype().itemsize());
  if (!buffer.defined()) {
    buffer = empty_scratch({rows * max_pixels_}, options_.dtype(dtype));
    held_bytes_ += buffer.nbytes();
    count_in_use(buffer.nbytes());
  }
  TORCH_INTERNAL_ASSERT(buffer.scalar_type() == dtype);
  return buffer;
}

CountedScratch::CountedScratch(const Tensor& scratch) : bytes_(scratch.nbytes()) {
  count_in_use(bytes_);
}

CountedScratch::~CountedScratch() { g_workspace_in_use -= bytes_; }

void set_workspace_limit(int64_t bytes) {
  TORCH_CHECK(bytes > 0, "torch_convbp: the workspace limit must be positive, got ", bytes);
  g_workspace_limit.store(bytes);
}

int64_t workspace_limit() { return g_workspace_limit.load(); }

int64_t workspace_peak(bool reset) {
  return reset ? g_workspace_peak.exchange(g_workspace_in_use.load()) : g_workspace_peak.load();
}

}  // namespace torch_convbp
