// What this CPU can do for the GEMMs (cpu_features.h).
#include "../cpu_features.h"

#include <ATen/Context.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

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

// AMX-BF16 (leaf 7, EDX bit 22) with the OS saving the tile state (XCR0 bits 17-18).
bool has_amx_bfloat16() {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1) &&
         (saved_state() & 0x60000) == 0x60000;
}

// bfloat16 arithmetic: AVX512_BF16 (leaf 7 subleaf 1, EAX bit 5), or AMX-BF16.
bool has_bfloat16_arithmetic() {
  unsigned a, b, c, d;
  const bool avx512_bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
  return avx512_bf16 || has_amx_bfloat16();
}

// Whether oneDNN's ISA is capped below `isa` by its environment variable (ONEDNN_MAX_CPU_ISA or
// DNNL_MAX_CPU_ISA), as on a machine made to behave like an AVX2 one: oneDNN's names, in order.
bool onednn_capped_below(std::string_view isa) {
  static constexpr std::string_view kOrder[] = {"SSE41",
                                                "AVX",
                                                "AVX2",
                                                "AVX2_VNNI",
                                                "AVX2_VNNI_2",
                                                "AVX512_CORE",
                                                "AVX512_CORE_VNNI",
                                                "AVX512_CORE_BF16",
                                                "AVX10_1_512",
                                                "AVX512_CORE_FP16",
                                                "AVX512_CORE_AMX",
                                                "AVX10_1_512_AMX",
                                                "AVX512_CORE_AMX_FP16",
                                                "AVX10_1_512_AMX_FP16",
                                                "AVX10_2_512",
                                                "AVX10_2_512_AMX_2"};
  const auto rank = [](std::string_view name) {
    for (size_t i = 0; i < std::size(kOrder); ++i) {
      if (kOrder[i] == name) return static_cast<int>(i);
    }
    return -1;
  };
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    std::string cap(value);
    std::transform(cap.begin(), cap.end(), cap.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
    const int cap_rank = rank(cap);
    return cap_rank >= 0 && cap_rank < rank(isa);  // ALL, DEFAULT or unknown: no cap
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
  static const bool prefers = is_amd() && has_avx512_core() && !onednn_capped_below("AVX512_CORE");
  return prefers && cpu_has_gemm_microkernel();
}

bool cpu_prefers_narrow_gemms_on_microkernel() {
  static const bool prefers = is_amd() && !onednn_capped_below("AVX2");
  return prefers && !cpu_prefers_gemm_microkernel() && cpu_has_gemm_microkernel();
}

bool cpu_allows_avx512_kernels() {
  static const bool allows = has_avx512_core() && !onednn_capped_below("AVX512_CORE");
  return allows;
}

bool cpu_has_bfloat16_microkernel() {
#if defined(CPUBLAS_BRGEMM_BF16BF16F32)
  static const bool native =
      has_avx512_core() && has_bfloat16_arithmetic() && !onednn_capped_below("AVX512_CORE_BF16");
  return native && cpu_has_gemm_microkernel();
#else
  return false;
#endif
}
bool cpu_has_amx_bfloat16_microkernel() {
  static const bool amx = has_amx_bfloat16() && !onednn_capped_below("AVX512_CORE_AMX");
  return amx && cpu_has_bfloat16_microkernel();
}
#else
bool cpu_has_gemm_microkernel() { return false; }
bool cpu_prefers_gemm_microkernel() { return false; }
bool cpu_prefers_narrow_gemms_on_microkernel() { return false; }
bool cpu_has_bfloat16_microkernel() { return false; }
bool cpu_has_amx_bfloat16_microkernel() { return false; }
bool cpu_allows_avx512_kernels() { return false; }
#endif

}  // namespace torch_convbp
