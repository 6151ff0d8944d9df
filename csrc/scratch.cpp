// The pool of CPU scratch memory (scratch.h).
#include "scratch.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "plan.h"

namespace torch_convbp {
namespace {

constexpr int64_t kMaxPooledBytes = int64_t{256} << 20;
constexpr int64_t kPage = 4096;
constexpr size_t kAlignment = 64;  // a cache line, as ATen's CPU allocator aligns

// Freed blocks by size. A request takes the smallest block of at least its size and at most
// twice it (a larger one would hold memory a smaller request does not need), else a new block.
class Pool {
 public:
  void* take(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= 2 * bytes) {
        void* block = it->second;
        pooled_ -= it->first;
        free_.erase(it);
        return block;
      }
    }
    void* block = std::aligned_alloc(kAlignment, bytes);  // bytes: a multiple of a page
    TORCH_CHECK(block != nullptr, "torch_convbp: out of memory: could not allocate ", bytes,
                " bytes of scratch memory");
    return block;
  }

  void give_back(void* block, int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (pooled_ + bytes <= std::min(kMaxPooledBytes, workspace_limit())) {
        free_.emplace(bytes, block);
        pooled_ += bytes;
        return;
      }
    }
    std::free(block);
  }

  int64_t release() {
    std::multimap<int64_t, void*> blocks;
    int64_t freed = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks.swap(free_);
      freed = pooled_;
      pooled_ = 0;
    }
    for (const auto& [bytes, block] : blocks) std::free(block);
    return freed;
  }

  int64_t pooled() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pooled_;
  }

 private:
  std::mutex mutex_;
  std::multimap<int64_t, void*> free_;
  int64_t pooled_ = 0;
};

// Never destroyed: scratch tensors may outlive static destruction at exit.
Pool& pool() {
  static Pool* const instance = new Pool();
  return *instance;
}

}  // namespace

at::Tensor empty_scratch(at::IntArrayRef size, at::TensorOptions options) {
  if (!options.device().is_cpu()) return at::empty(size, options);
  int64_t elements = 1;
  for (const int64_t s : size) elements *= s;
  const int64_t needed = elements * static_cast<int64_t>(options.dtype().itemsize());
  const int64_t bytes = std::max<int64_t>(kPage, (needed + kPage - 1) / kPage * kPage);
  void* block = pool().take(bytes);
  return at::from_blob(
      block, size, [bytes](void* data) { pool().give_back(data, bytes); }, options);
}

int64_t release_scratch() { return pool().release(); }

int64_t pooled_scratch_bytes() { return pool().pooled(); }

}  // namespace torch_convbp
