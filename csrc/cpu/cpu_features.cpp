// What this CPU can do for the GEMMs (cpu_features.h).
#include "../cpu_features.h"

#include <ATen/Context.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace torch_convbp {

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

// The register state the OS saves (XCR0): bits 1-2 for AVX, 5-7 for AVX-512.
unsigned saved_state() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
  unsigned xcr0_low, xcr0_high;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  return xcr0_low;
}

// AVX2 (CPUID leaf 7, EBX bit 5) and FMA (leaf 1, ECX bit 12), with the AVX registers saved by
// the OS. Read with cpuid directly, as the CPU reports them.
bool has_avx2_and_fma() {
  unsigned a, b, c, d;
  if ((saved_state() & 0x6) != 0x6 || !__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool fma = (c >> 12) & 1;
  return fma && __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((b >> 5) & 1);
}

// AVX-512 F, DQ, BW and VL (leaf 7, EBX bits 16, 17, 30, 31): oneDNN's avx512_core.
bool has_avx512_core() {
  unsigned a, b, c, d;
  if ((saved_state() & 0xe6) != 0xe6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const unsigned wanted = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
  return (b & wanted) == wanted;
}

bool is_amd() {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  return std::strcmp(vendor, "AuthenticAMD") == 0;
}

// Whether oneDNN's ISA is capped below AVX-512 by its environment variable (SSE41, AVX, AVX2,
// AVX2_VNNI, ...), as on a machine made to behave like an AVX2 one.
bool onednn_capped_below_avx512() {
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    std::string isa(value);
    std::transform(isa.begin(), isa.end(), isa.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
    return isa.rfind("SSE", 0) == 0 || isa == "AVX" || isa.rfind("AVX2", 0) == 0;
  }
  return false;
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

bool cpu_prefers_gemm_microkernel() {
  static const bool prefers = is_amd() && has_avx512_core() && !onednn_capped_below_avx512();
  return prefers && cpu_has_gemm_microkernel();
}
#else
bool cpu_has_gemm_microkernel() { return false; }
bool cpu_prefers_gemm_microkernel() { return false; }
#endif

}  // namespace torch_convbp
