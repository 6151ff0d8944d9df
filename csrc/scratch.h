// Scratch memory of the CPU routes, kept between calls (scratch.cpp).
//
// On this kind of machine the first write to each page of freshly mapped memory faults, at about
// the cost of writing the page 5-10 times (benchmarks/NOTES.md, "The machine's ceilings"), and
// glibc maps large blocks afresh on many calls: a column matrix, a flipped weight or a partial
// sum of several MB then cost more in faults than in arithmetic (section 37). So the CPU's
// scratch tensors take their memory from a pool of blocks that earlier calls freed, and give it
// back when they die. The pool keeps at most min(workspace limit, 256 MiB) of freed blocks;
// release_scratch() frees them. Other devices have caching allocators of their own.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_convbp {

// Where a tensor's memory comes from: a result's (what an operator returns) from ATen's
// allocator, scratch (what lives within a call) from the pool below.
enum class Memory { result, scratch };

// An uninitialised contiguous tensor for scratch use: on the CPU from the pool, elsewhere
// at::empty. Not for results a user receives (they would hold pool memory).
at::Tensor empty_scratch(at::IntArrayRef size, at::TensorOptions options);

// Frees every block the pool keeps; returns the bytes freed.
int64_t release_scratch();
// The bytes the pool keeps now (blocks not in use).
int64_t pooled_scratch_bytes();

}  // namespace torch_convbp
