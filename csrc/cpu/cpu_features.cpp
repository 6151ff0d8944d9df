// What this CPU can do for the GEMMs: oneDNN's float32 micro-kernel (cpu_features.h).
#include "../cpu_features.h"

#include <ATen/Context.h>
#include <ATen/native/CPUBlas.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace torch_convbp {

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

// AVX2 (CPUID leaf 7, EBX bit 5) and FMA (leaf 1, ECX bit 12), with the AVX registers saved by
// the OS (XCR0 bits 1 and 2). Read with cpuid directly, as the CPU reports them.
bool has_avx2_and_fma() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  const bool fma = (c >> 12) & 1;
  unsigned xcr0_low, xcr0_high;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  if ((xcr0_low & 0x6) != 0x6) return false;
  return fma && __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((b >> 5) & 1);
}

}  // namespace

bool cpu_has_gemm_microkernel() {
#if defined(CPUBLAS_BRGEMM_F32F32F32)
  static const bool avx2_fma = has_avx2_and_fma();
  return avx2_fma && at::globalContext().userEnabledMkldnn();
#else
  return false;  // a torch that does not export the micro-kernel
#endif
}
#else
bool cpu_has_gemm_microkernel() { return false; }
#endif

}  // namespace torch_convbp
