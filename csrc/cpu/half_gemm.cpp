// Whether this CPU has instructions for float16 / bfloat16 matrix products.
#include "../gemm_dtype.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace torch_convbp {

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

struct HalfInstructions {
  bool bf16 = false, fp16 = false;
};

// From CPUID leaf 7 (AVX512-BF16: sub-leaf 1, EAX bit 5; AVX512-FP16: sub-leaf 0, EDX bit 23;
// AMX machines have both), provided the OS saves the AVX-512 registers (XCR0 bits 1, 2, 5-7).
// Read with cpuid directly: __builtin_cpu_supports knows these names only in recent compilers.
HalfInstructions detect_half_instructions() {
  HalfInstructions found;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return found;
  unsigned xcr0_low, xcr0_high;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  if ((xcr0_low & 0xE6) != 0xE6) return found;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) found.fp16 = (d >> 23) & 1;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) found.bf16 = (a >> 5) & 1;
  return found;
}

}  // namespace

bool cpu_has_native_half_gemm(at::ScalarType dtype) {
  // Without these ATen's half-precision GEMM is emulated, at a few percent of float32's speed
  // (benchmarks/NOTES.md, section 6).
  static const HalfInstructions found = detect_half_instructions();
  return dtype == at::kBFloat16 ? found.bf16 : dtype == at::kHalf ? found.fp16 : true;
}
#else
bool cpu_has_native_half_gemm(at::ScalarType) {
  return true;  // not measured beyond x86-64 (ARM, say): ATen's own kernels decide
}
#endif

}  // namespace torch_convbp
