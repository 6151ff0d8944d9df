// The choice of route: every rule in one function, in the order they are tried. The reasons
// behind each threshold are measurements, in the benchmarks/NOTES.md sections named below.
#include "route.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <string_view>

#include "cpu_features.h"
#include "env_choice.h"
#include "gemm_choice.h"
#include "implicit_volumes.h"
#include "plan.h"
#include "summation.h"

namespace torch_convbp {
namespace {

// The NHWC column matrix pays where each group's GEMM writes rows of at least this many output
// channels and, with several groups, im2col copies runs of at least this many input channels per
// tap. With one group a kernel row's taps are one run of kw*C channels whatever C is, so an RGB
// stem qualifies. Narrower rows and runs fall far below a cache line and a GEMM tile, and those
// layers ran faster in NCHW, layout copies included (NOTES sections 17 and 19).
constexpr int64_t kMinNhwcGroupChannels = 16;

// Groups with at most this many output channels (not depthwise) have direct kernels: each
// group's GEMMs would be a few rows thin, and the column matrix in either layout left ResNeXt's
// 3x3 layers far behind oneDNN (NOTES sections 20 to 22).
constexpr int64_t kMaxDirectGroupChannels = 32;

// The implicit route (GEMMs on shifted views of the input, no column matrix) pays where each
// tap's GEMM has enough input channels to be a GEMM and each output row enough pixels, and the
// channels are few enough that the column matrix would cost much beside the GEMM: 16 to 256
// input channels per group, output rows of 14 pixels or more (on an AVX-512 Xeon: NOTES section
// 26; 256 since its tiles took bands of rows and its B matrices a tap at a time, 0.83-0.95x the
// column route's time at 256@14 and 256@28, 1.0-1.2x at 512@14: section 61). On a CPU where the
// micro-kernel outruns MKL (cpu_prefers_gemm_microkernel: an AVX-512 EPYC), it took every layer of
// 16 channels or more per group, 512@7 included, at oneDNN's speed, where the columns route on the
// same micro-kernel took 1.1-1.3x; but not a strided 1x1 layer, one tap, whose column matrix is a
// plain gather (NOTES section 36). In bfloat16 on an AMX Xeon it took the layers of more than one
// tap and rows of 14 or more, however many channels: 256@14's forward and input gradient 0.6x and
// 0.45x the columns route's time, 512@7's 1.9x (NOTES section 54).
constexpr int64_t kMinImplicitChannels = 16;
constexpr int64_t kMaxImplicitChannels = 256;
constexpr int64_t kMinImplicitRow = 14;

// Whether the micro-kernel outruns MKL's column route on the implicit route's calls here: where it
// outruns MKL (cpu_prefers_gemm_microkernel: an AVX-512 EPYC), and on an AMD CPU without AVX-512,
// where it outruns MKL on results at most 256 columns wide
// (cpu_prefers_narrow_gemms_on_microkernel) and every call of the route writes one of those (tiles
// of at most 256 output channels; dW's of 32). There, on an AVX2 Zen 1, the NCHW column route's
// GEMMs ran at 17-25 GFLOP/s against 28-33 for the NHWC shapes, and the implicit weight gradient
// took 0.65-0.8x the column route's time fed NCHW (benchmarks/NOTES.md, sections 115 and 118).
bool implicit_calls_outrun_mkl() {
  return cpu_prefers_gemm_microkernel() || cpu_prefers_narrow_gemms_on_microkernel();
}

// Whether the implicit route's kernels compute 2-D operands like `first` on the CPU: float32, or
// bfloat16 wherever the micro-kernel computes it (an EPYC's AVX512_BF16, a Xeon's AMX).
bool implicit_operands(const ConvShape& s, const at::Tensor& first) {
  const auto dtype = first.scalar_type();
  return s.is_planar() && first.device().is_cpu() &&
         (dtype == at::kFloat ||
          (dtype == at::kBFloat16 && gemm_dtype(dtype, first.device()) == dtype));
}

// What TORCH_CONVBP_GEMM (gemm_choice.h) says of an implicit-route call: never (mkl, or no
// micro-kernel here), wherever the kernels compute it (microkernel), or nothing (auto: the rules).
std::optional<bool> implicit_setting() {
  const GemmSetting setting = gemm_setting();
  if (setting == GemmSetting::mkl || !cpu_has_gemm_microkernel()) return false;
  if (setting == GemmSetting::microkernel) return true;
  return std::nullopt;
}

// Whether the implicit route computes convolution `s` (a forward one: for the input gradient,
// its transposed convolution, or with `scatter` the products scattered into a strided one's dX)
// of these operands on the CPU, in NHWC (implicit_operands), bfloat16 with input channels per
// group in pairs (the micro-kernel's VNNI layout). Narrower inputs than kMinImplicitChannels where
// a kernel row's taps make one call of that many or more (implicit_merges_kernel_rows), in
// float32 where the micro-kernel outruns MKL: fed channels_last, the RGB stem's forward (K = 21
// per call) took 0.90-0.91x the column route's time, 8>32 3x3 and 12>64 5x5 0.83-0.88x; with
// K = 9 (3x3 of 3 channels) no faster, so not there (NOTES section 114).
bool takes_implicit(const ConvShape& s, const at::Tensor& first, bool scatter) {
  const bool bfloat16 = first.scalar_type() == at::kBFloat16;
  if (!implicit_operands(s, first) || (bfloat16 && s.in_channels / s.groups % 2 != 0)) {
    return false;
  }
  if (const std::optional<bool> forced = implicit_setting()) return *forced;
  const int64_t group_in = s.in_channels / s.groups, group_out = s.out_channels / s.groups;
  const bool wide_enough = group_in >= kMinImplicitChannels && group_out >= kMinNhwcGroupChannels;
  const bool rows_wide_enough = !scatter && !bfloat16 && implicit_merges_kernel_rows(s) &&
                                s.kernel_w * s.in_channels >= kMinImplicitChannels &&
                                group_out >= kMinNhwcGroupChannels;
  if (cpu_prefers_gemm_microkernel()) return (wide_enough || rows_wide_enough) && s.taps() > 1;
  if (bfloat16) return wide_enough && s.taps() > 1 && s.out_width >= kMinImplicitRow;
  return wide_enough && group_in <= kMaxImplicitChannels && s.out_width >= kMinImplicitRow;
}

// The channels-last format of a tensor of this rank: channels_last, or channels_last_3d.
at::MemoryFormat channels_last_format(int64_t rank) {
  return rank == 5 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
}

// Whether every operand is channels_last by its strides (as suggest_memory_format decides),
// dense in it, and not empty.
bool all_channels_last(at::TensorList operands) {
  for (const at::Tensor& t : operands) {
    const auto format = channels_last_format(t.dim());
    if ((t.dim() != 4 && t.dim() != 5) || t.numel() == 0 || t.suggest_memory_format() != format ||
        !t.is_contiguous(format)) {
      return false;
    }
  }
  return true;
}

bool has_narrow_groups(const ConvShape& s) {
  return s.is_planar() && s.groups > 1 && !s.is_depthwise() &&
         s.out_channels / s.groups <= kMaxDirectGroupChannels;
}

// Whether operands fed NCHW take the grouped kernels (narrow groups, has_narrow_groups) on the
// CPU, through layout copies, instead of the NCHW column route (whose im2col writes 9 values per
// input value at 3x3, for GEMMs a few rows thin) or the implicit one. Per operator, ResNeXt's 3x3
// layers of 32 groups at batch 8, copies included (NOTES section 123), in float32:
// - the forward and the stride-1 input gradient, where the convolution computed has at most
//   kMaxNchwGroupedChannels output channels per group: 0.21-0.84x the time at 4, 8 and 16 channels
//   per group, 56x56 planes and strided layers too; at 32 channels 1.2-1.5x;
// - the weight gradient, where the input's planes have at most kMaxNchwGroupedPlane pixels:
//   0.54-0.91x at 28x28 and smaller, 4 to 32 channels per group; on 56x56 planes, where the copies
//   of x and dY are largest, 1.0-1.6x.
// In bfloat16 the column route's GEMMs run on the micro-kernel in bfloat16, and the grouped
// kernels trail them at 8 or more channels per group (1.1-1.9x), but not
// - the weight gradient of at most kMaxNchwBfloat16GroupedWeightGradChannels output channels per
//   group: 0.36-0.71x, 56x56 planes too (a strided one 1.03x; 16 per group: 1.28x);
// - the forward and input gradient of at most kMaxNchwBfloat16GroupedChannels (the groups summed
//   across, two to a vector of lanes) on planes of at most kMaxNchwGroupedPlane pixels:
//   0.59-0.67x at 28x28, 1.05-1.12x at 56x56.
constexpr int64_t kMaxNchwGroupedChannels = 16;
constexpr int64_t kMaxNchwGroupedPlane = 1024;
constexpr int64_t kMaxNchwBfloat16GroupedChannels = 4;
constexpr int64_t kMaxNchwBfloat16GroupedWeightGradChannels = 8;

bool grouped_pays_layout(Operator op, const ConvShape& computed, const at::Tensor& first) {
  const auto dtype = first.scalar_type();
  if (!first.device().is_cpu() || (dtype != at::kFloat && dtype != at::kBFloat16) ||
      first.numel() == 0) {
    return false;
  }
  const int64_t group_outputs = computed.out_channels / computed.groups;
  const bool small_planes = computed.height * computed.width <= kMaxNchwGroupedPlane;
  if (dtype == at::kBFloat16) {
    return op == Operator::weight_grad
               ? group_outputs <= kMaxNchwBfloat16GroupedWeightGradChannels
               : group_outputs <= kMaxNchwBfloat16GroupedChannels && small_planes;
  }
  return op == Operator::weight_grad ? small_planes : group_outputs <= kMaxNchwGroupedChannels;
}

bool has_wide_groups(const ConvShape& s) {
  const bool wide_inputs = s.groups == 1 || s.in_channels / s.groups >= kMinNhwcGroupChannels;
  return wide_inputs && s.out_channels / s.groups >= kMinNhwcGroupChannels;
}

// col2im_nhwc gathers each input pixel's terms tap by tap in runs of C/G channels, one group or
// several: an RGB stem's strided input gradient took 2.6x (2-D) and 5.4x (3-D) its NCHW time
// there, layout copies included (NOTES section 29).
bool has_wide_input_groups(const ConvShape& s) {
  return s.in_channels / s.groups >= kMinNhwcGroupChannels;
}

// The weight gradient of a 1x1 NCHW layer as a product per image (pointwise_by_images), summed in
// halves, instead of the column route's chunks, whose images a GPU copies into the column matrix
// and the output gradient into staging (NCHW keeps one image's pixels together, not a chunk's).
// Where the products' traffic (about 2.5 weights per image: written by the GEMM, then summed)
// stays under half of the copies' (2 x (Cin + Cout) x pixels per image), in float32 or float64
// (the products are in the operands' dtype; half precision sums in float32 by the column route),
// and the products fit the workspace limit. Not on the CPU, whose chunks there are single images,
// views already: a training step of 1x1 64>256@56 took 0.97-1.16x its time this way, no gain
// (NOTES section 33). TORCH_CONVBP_POINTWISE_WEIGHT_GRAD=by_images takes it wherever the rule
// holds, on the CPU too, =columns never: for tests and benchmarks.
bool weight_grad_by_images(const ConvShape& s, const at::Tensor& first) {
  const std::string_view choice =
      env_choice("TORCH_CONVBP_POINTWISE_WEIGHT_GRAD", {"auto", "by_images", "columns"});
  if (choice == "columns" || (choice == "auto" && first.device().is_cpu())) return false;
  if (at::isReducedFloatingType(first.scalar_type())) return false;
  const int64_t weight = s.in_channels * s.out_channels;
  const int64_t pixels = s.input_rows() * s.width;
  const int64_t products_bytes = s.batch * weight * static_cast<int64_t>(first.element_size());
  return 5 * weight <= 2 * (s.in_channels + s.out_channels) * pixels &&
         products_bytes <= workspace_limit();
}

// Whether the implicit route takes operands of this layout for convolution `s` (a forward one),
// given takes_implicit: channels_last ones always; NCHW ones through layout copies where the
// route outruns the NCHW column route, copies included:
// - on a CPU where the micro-kernel outruns MKL, every layer it takes (NOTES section 40);
// - in bfloat16 where the micro-kernel computes it (an AMX Xeon), from the route's 16 channels per
//   group: 0.65-0.87x the column route's time at 32 and 64 channels (sections 58, 60);
// - in float32 (an AMX Xeon), stride 1 with more than one tap: 0.77-0.92x on the dense 3x3 and
//   5x5 layers, where the strided and 1x1 ones took 1.02-1.10x (section 66);
// - in float32 where the micro-kernel outruns MKL on the route's calls (implicit_calls_outrun_mkl:
//   an AMD CPU without AVX-512 too), strided layers of more than one tap as well: on an AVX2 Zen 1
//   3x3/2 64>128@56 and 128>256@28 took 0.80-0.86x the column route's forward (section 118);
// but not the inputs narrower than kMinImplicitChannels (by default): fed NCHW, the RGB stem's
// forward on merged kernel rows took 1.03-1.06x the column route's time (section 114).
bool implicit_pays_layout(const ConvShape& s, const at::Tensor& first, bool channels_last) {
  if (channels_last) return true;
  if (s.in_channels / s.groups < kMinImplicitChannels && !implicit_setting().has_value()) {
    return false;
  }
  const bool unit_stride = s.stride_h == 1 && s.stride_w == 1;
  return cpu_prefers_gemm_microkernel() || first.scalar_type() == at::kBFloat16 ||
         (s.taps() > 1 && (unit_stride || implicit_calls_outrun_mkl()));
}

// Whether a bfloat16 call of NCHW operands on the column route computes in NHWC, through layout
// copies (a stride-1 weight gradient with rows of 14 or more takes the implicit route first): where
// the micro-kernel computes bfloat16 (an AMX Xeon), for 2-D layers of more than one tap and 16 or
// more output channels per group, and
// - the weight gradient: 16 or more input channels per group and output planes under
//   kMaxCopiedWeightGradPlane pixels. It took 0.58-0.92x the NCHW column route's time, copies
//   included, the strided layers too; on 56x56 output planes 1.0-1.17x, where the copies are
//   largest (NOTES section 67);
// - the input gradient through col2im (a strided layer's): 32 or more input channels per group.
//   It took 0.68-0.82x; with 16 input channels 1.13x, and a strided 1x1 layer 1.12-1.26x (section
//   68).
constexpr int64_t kMaxCopiedWeightGradPlane = 1024;
constexpr int64_t kMinCopiedCol2imChannels = 32;
bool bfloat16_columns_pay_layout(Operator op, const ConvShape& s, const at::Tensor& first) {
  if (first.scalar_type() != at::kBFloat16 || !first.device().is_cpu() || !s.is_planar() ||
      gemm_dtype(first.scalar_type(), first.device()) != at::kBFloat16 || s.taps() == 1 ||
      !has_wide_groups(s)) {
    return false;
  }
  const int64_t group_in = s.in_channels / s.groups;
  if (op == Operator::weight_grad) {
    return group_in >= kMinNhwcGroupChannels &&
           s.out_height * s.out_width < kMaxCopiedWeightGradPlane;
  }
  return op == Operator::input_grad && group_in >= kMinCopiedCol2imChannels;
}

// Whether the implicit route computes the weight gradient of convolution `s`: GEMMs per tap on
// shifted views of padded copies of the input and the output gradient, no column matrix
// (cpu/implicit_weight_grad_cpu.cpp). For operands of stride 1, more than one tap, 16 or more
// channels per group and output rows of 14 pixels or more, on the CPU (implicit_operands):
// - bfloat16 where the micro-kernel computes it (an AMX Xeon): 0.50-0.96x the column route's
//   time, deep and dilated layers too, where im2col and the VNNI packing of the column matrix
//   took about half of it (NOTES sections 56, 69); fed NCHW too, through layout copies,
//   0.59-0.93x the NCHW or NHWC column route's, copies included (the operands read as they are
//   since section 112);
// - float32 fed channels_last, up to kMaxImplicitWeightGradChannels channels per group, no fewer
//   input than output channels, undilated: 0.89-0.96x; 32>64@56 took 1.10x and
//   the dilated 64@28 1.05x, where the copies weigh more beside the GEMMs, and 256@14 no gain
//   (section 69);
// - float32 fed NCHW, the same layers, through layout copies, on a CPU that runs AVX-512 kernels:
//   there MKL ran the NCHW column route's GEMM, [Cout, P] @ [P, K] with both operands read along
//   P, at 0.65-0.85x the rate of the same GEMM of NHWC columns; 5x5 64@28 took 0.75x the column
//   route's time, 3x3 128@28 0.9x, 3x3 64@56 0.97x. With AVX2 (oneDNN capped) 128@28 took 1.2x:
//   Intel's AVX2 CPUs keep the column route (section 94).
// - float32 where the micro-kernel outruns MKL on the route's calls (implicit_calls_outrun_mkl),
//   either format, up to the implicit route's kMaxImplicitChannels and dilated too: on an AVX-512
//   EPYC 3x3 256@14 1.11-1.13x ATen's time per call fed channels_last and 1.02-1.07x fed NCHW,
//   against the column route's 1.19-1.23x and 1.15-1.18x; deeplab's dilated 256@28 1.02-1.06x and
//   1.13-1.16x against 1.11-1.13x and 1.19-1.26x (section 112). On an AVX2 Zen 1, fed NCHW, 5x5
//   64@28 0.65-0.68x the column route's time, 3x3 64@56 0.72-0.79x, 128@28 0.73-0.81x, 256@14
//   0.75-0.79x, deeplab 0.86-0.93x; fed channels_last 256@14 0.87-0.90x, deeplab 0.94-1.03x
//   (section 118).
// - float32 on a CPU that runs AVX-512 kernels (an AMX Xeon), dilated layers too, and fed NCHW up
//   to kMaxImplicitChannels: deeplab's d2 64@56 and 128@28 0.91-0.95x the column route's time in
//   either format, fed NCHW 256@14 0.94x and the d2 256@28 0.95-0.96x; fed channels_last 256@14
//   1.03-1.04x and the d2 256@28 1.00x, so channels_last keeps kMaxImplicitWeightGradChannels
//   (section 119).
constexpr int64_t kMaxImplicitWeightGradChannels = 128;
bool takes_implicit_weight_grad(const ConvShape& s, const at::Tensor& first, bool channels_last) {
  const bool bfloat16 = first.scalar_type() == at::kBFloat16;
  if (!implicit_operands(s, first) || s.stride_h != 1 || s.stride_w != 1 || s.taps() == 1 ||
      (!channels_last && !bfloat16 && !cpu_allows_avx512_kernels() &&
       !implicit_calls_outrun_mkl())) {
    return false;
  }
  if (const std::optional<bool> forced = implicit_setting()) return *forced;
  const int64_t group_in = s.in_channels / s.groups, group_out = s.out_channels / s.groups;
  if (group_in < kMinImplicitChannels || group_out < kMinNhwcGroupChannels ||
      s.out_width < kMinImplicitRow) {
    return false;
  }
  const bool outruns = implicit_calls_outrun_mkl(), avx512 = cpu_allows_avx512_kernels();
  const int64_t max_in =
      outruns || (avx512 && !channels_last) ? kMaxImplicitChannels : kMaxImplicitWeightGradChannels;
  return bfloat16 || (group_in <= max_in && group_in >= group_out &&
                      (outruns || avx512 || (s.dilation_h == 1 && s.dilation_w == 1)));
}

// Whether the implicit route computes the input gradient of a convolution `s` that is not a
// stride-1 convolution of dY (strided, or padded past the kernel's reach) by scattering dY's
// GEMMs per tap into dX's pixels (cpu/implicit_nhwc_cpu.cpp, TileProducts). Its GEMMs are the
// forward's with K and N swapped (K = Cout/G, N = C/G, dY's rows as M), so the forward's rule
// holds on that shape; by default only where the micro-kernel outruns MKL on the route's calls
// (implicit_calls_outrun_mkl). On an AVX-512 EPYC 3x3/2 64>128@56 fed channels_last took
// 1.26-1.34x ATen's time per call on the column route, 0.99x scattered; the strided 3x3 and 5x5
// layers 0.78-1.03x (NOTES section 111). On an AVX2 Zen 1 3x3/2 64>128@56 and 128>256@28 took
// 0.66-0.80x the column route's time (section 118). On an AMX Xeon, which runs AVX-512 kernels,
// the strided 3x3 and 5x5 layers fed channels_last took 0.81-0.94x in float32, and 0.65-0.79x in
// bfloat16, 0.68-0.90x fed NCHW through layout copies (section 119; float32 fed NCHW keeps the
// column route there, implicit_pays_layout). Intel's CPUs without AVX-512 not measured. By
// default not a layer of one tap, whose col2im is a plain scatter (not measured). bfloat16 of one
// group, undilated along the width, computes the same products as phase convolutions of dY on
// padded rows instead (cpu/padded_rows_cpu.cpp: 0.66-0.91x the scatter's time, section 120).
bool takes_implicit_scatter(const ConvShape& s, const at::Tensor& first, bool channels_last) {
  ConvShape products = s;
  std::swap(products.in_channels, products.out_channels);
  const bool scatter_pays = implicit_calls_outrun_mkl() || cpu_allows_avx512_kernels();
  return implicit_pays_layout(products, first, channels_last) &&
         takes_implicit(products, first, /*scatter=*/true) &&
         ((scatter_pays && s.taps() > 1) || implicit_setting().has_value());
}

// explain()'s line for the implicit weight gradient (takes_implicit_weight_grad): which operands
// take it on this CPU, and that NCHW ones are read as they are.
const char* implicit_weight_grad_why(const at::Tensor& first, bool channels_last) {
  const int rule = first.scalar_type() == at::kBFloat16 ? 3
                   : implicit_calls_outrun_mkl()        ? 0
                   : cpu_allows_avx512_kernels()        ? 1
                                                        : 2;
  static const char* const why[4][2] = {
      {"float32 on a CPU where the GEMM micro-kernel outruns MKL on this route's calls; 16 to 256 "
       "input channels per group and no more output channels, output rows of 14 pixels or more: "
       "NCHW operands read as they are",
       "channels_last float32 operands on a CPU where the GEMM micro-kernel outruns MKL on this "
       "route's calls; 16 to 256 input channels per group and no more output channels, output rows "
       "of 14 pixels or more"},
      {"float32 on a CPU that runs AVX-512 kernels; 16 to 256 input channels per group and no "
       "more output channels, output rows of 14 pixels or more: NCHW operands read as they are",
       "channels_last float32 operands on a CPU that runs AVX-512 kernels; 16 to 128 input "
       "channels per group and no more output channels, output rows of 14 pixels or more"},
      {"float32 fed NCHW takes it only on a CPU that runs AVX-512 kernels or whose GEMM "
       "micro-kernel outruns MKL on this route's calls",
       "channels_last float32 operands on a CPU with the GEMM micro-kernel; 16 to 128 input "
       "channels per group and no more output channels, undilated, output rows of 14 pixels or "
       "more"},
      {"bfloat16 on a CPU whose GEMM micro-kernel computes bfloat16; 16 or more channels per "
       "group, output rows of 14 pixels or more: NCHW operands read as they are",
       "channels_last bfloat16 operands on a CPU whose GEMM micro-kernel computes bfloat16; 16 or "
       "more channels per group, output rows of 14 pixels or more"},
  };
  return why[rule][channels_last ? 1 : 0];
}

// explain()'s line for the implicit route's layout: which operands take it on this CPU, and
// whether through layout copies.
const char* implicit_why_layout(const at::Tensor& first, bool channels_last) {
  const int rule = cpu_prefers_gemm_microkernel()         ? 0
                   : first.scalar_type() == at::kBFloat16 ? 1
                   : implicit_calls_outrun_mkl()          ? 2
                                                          : 3;
  static const char* const why[4][2] = {
      {"float32 or bfloat16 on a CPU where the GEMM micro-kernel outruns MKL; 16 or more channels "
       "per group, more than one tap: NHWC, through layout copies",
       "channels_last float32 or bfloat16 operands on a CPU where the GEMM micro-kernel outruns "
       "MKL; 16 or more channels per group (or, float32 of one group, kernel rows of 16 or more "
       "channels), more than one tap"},
      {"bfloat16 on a CPU whose GEMM micro-kernel computes bfloat16; 16 or more channels per "
       "group, more than one tap, output rows of 14 pixels or more: NHWC, through layout copies",
       "channels_last bfloat16 operands on a CPU whose GEMM micro-kernel computes bfloat16; 16 or "
       "more channels per group, more than one tap, output rows of 14 pixels or more"},
      {"float32 on a CPU where the GEMM micro-kernel outruns MKL on this route's calls (results at "
       "most 256 columns wide); 16 to 256 channels per group, output rows of 14 pixels or more, "
       "more than one tap: NHWC, through layout copies",
       "channels_last float32 operands on a CPU where the GEMM micro-kernel outruns MKL on this "
       "route's calls (results at most 256 columns wide); 16 to 256 channels per group, output "
       "rows of 14 pixels or more"},
      {"float32 on a CPU with the GEMM micro-kernel; 16 to 256 channels per group, output rows of "
       "14 pixels or more, stride 1 and more than one tap: NHWC, through layout copies",
       "channels_last float32 operands on a CPU with the GEMM micro-kernel; 16 to 256 channels per "
       "group, output rows of 14 pixels or more"},
  };
  return why[rule][channels_last ? 1 : 0];
}

// Whether the input gradient of a stride-1 convolution takes the col2im route instead of the
// forward convolution of dY (transposed_columns): on the CPU, in float32, where the weight has at
// least as many elements as the output gradient. The forward convolution of dY first writes the
// weight with each group's channels swapped and its taps reversed (flipped_transposed_weight), a
// pass that ran at 4-5x a plain copy's time (NOTES section 95); the col2im route's GEMM reads the
// weight as it is (W^T, a GEMM flag) and pays col2im's adds over the columns of dY's size instead.
// Per operator, fed NCHW: 3x3 512@7 0.77-0.85x the time, 1024@7 0.76x, 256@7 0.75x, 512@14 0.89x,
// 256@14 level, channels_last 512@7 0.82x; with oneDNN and MKL capped at AVX2 512@7 0.82-0.84x,
// 512@14 0.91x, and where the weight is the smaller 128@28 1.05x and 64@56 1.10x (section 101).
bool input_grad_pays_col2im(const ConvShape& s, const at::Tensor& first) {
  const int64_t weight_per_output_channel = s.in_channels / s.groups * s.taps();
  const int64_t output_gradient_per_channel = s.batch * s.output_rows() * s.out_width;
  return first.device().is_cpu() && first.scalar_type() == at::kFloat &&
         weight_per_output_channel >= output_gradient_per_channel;
}

}  // namespace

RouteChoice choose_route(Operator op, const ConvShape& s, at::TensorList activations) {
  const at::Tensor& first = activations.front();
  const bool channels_last = all_channels_last(activations);
  const Layout operand_layout = channels_last ? Layout::nhwc : Layout::nchw;
  const char* why_operand_layout = channels_last
                                       ? "operands channels_last"
                                       : "operands not all channels_last (dense, non-empty)";

  // A depthwise volume on the CPU: the NHWC forward and input gradient with a depth sum each
  // result's kd*kh*kw terms at once, the weight gradient in the order of rows takes each row's
  // sums over the slices it reads. As sums over the depth taps of the 2-D kernels (section 130)
  // each tap added a pass of the result: ir-CSN's 256@8x28 step took 1.3x the time these kernels
  // give it, MViT's strided pooling 2.2x (its forward took the 3-D column route fed NCDHW)
  // (benchmarks/NOTES.md, section 132). NCDHW operands stay so: the kernels transpose a block of
  // channels (the weight gradient's: a band of rows) at a time in cache, as for NCHW images,
  // where whole copies into channels_last_3d and back took most of the step (section 133).
  const bool float_or_double =
      first.scalar_type() == at::kFloat || first.scalar_type() == at::kDouble;
  if (s.is_depthwise() && !s.is_planar() && first.device().is_cpu() && float_or_double) {
    return {Route::depthwise, operand_layout,
            "one input channel per group, a volume (CPU, float32 or float64): the direct kernels "
            "of volumes, no GEMM",
            channels_last ? "operands channels_last_3d"
                          : "NCDHW operands, a block of channels at a time transposed in cache"};
  }
  if (s.is_depthwise() && s.is_planar()) {
    const char* why = "one input channel per group: direct kernels, no GEMM";
    // The CPU's kernels compute small planes fed NCHW with their NHWC kernels themselves, without
    // layout copies (summation.h), all but the weight gradient in the order of lanes.
    if (!channels_last && first.device().is_cpu() && op == Operator::weight_grad &&
        cpu_depthwise_order() == DepthwiseOrder::lanes &&
        s.out_height * s.out_width < kMinNchwDepthwisePlane) {
      return {Route::depthwise, Layout::nhwc, why,
              "the CPU's weight gradient in the order of lanes, output planes under 256 pixels: "
              "its NHWC kernel (the same bits), through layout copies"};
    }
    return {Route::depthwise, operand_layout, why, why_operand_layout};
  }

  // A volume deeper than one slice whose slices would take the implicit route (implicit_volumes.h's
  // rule): the implicit kernels compute it whole, its depth slices' rows as an image's rows and its
  // kernel rows the (depth tap, kernel row) pairs (cpu/implicit_nhwc_cpu.cpp); the weight gradient
  // its padded depth slices as one plane, its operands read as they are
  // (cpu/implicit_weight_grad_cpu.cpp).
  if (!s.is_planar() && implicit_volume_route(op, s, activations)) {
    const char* why_layout =
        "float32 channels_last_3d operands, or NCDHW ones through a copy into that format where "
        "the plane's kernel reads at least as many input values as the plane holds";
    if (op == Operator::weight_grad) {
      return {Route::implicit_nhwc, operand_layout,
              "a volume whose depth slices take the implicit route: stride 1: a GEMM per tap on "
              "shifted views of padded copies of the input and the output gradient (no column "
              "matrix), the padded depth slices one plane",
              "float32 channels_last_3d or NCDHW operands, read as they are"};
    }
    if (op == Operator::forward) {
      return {Route::implicit_nhwc, Layout::nhwc,
              "a volume whose depth slices take the implicit route: a GEMM per tap on views of the "
              "input (no column matrix), the kernel rows of every depth tap in turn",
              why_layout};
    }
    return {Route::implicit_nhwc, Layout::nhwc,
            input_grad_convolution(s)
                ? "a volume whose depth slices take the implicit route: stride 1: the forward "
                  "convolution of the output gradient, a GEMM per tap on views of it (no column "
                  "matrix), the kernel rows of every depth tap in turn"
                : "a volume whose depth slices take the implicit route: a GEMM per tap on views of "
                  "the output gradient, added into the input gradient's pixels it reaches (no "
                  "column matrix, no col2im)",
            why_layout};
  }

  const bool gemms_in_own_dtype =
      gemm_dtype(first.scalar_type(), first.device()) == first.scalar_type();
  if (s.is_pointwise() && s.groups == 1 && gemms_in_own_dtype) {
    if (channels_last) {
      return {Route::pointwise_nhwc, Layout::nhwc,
              "1x1, stride 1, unpadded, one group: one GEMM on the tensors' own memory",
              why_operand_layout};
    }
    if (op != Operator::weight_grad) {
      return {Route::pointwise_by_images, Layout::nchw,
              "1x1, stride 1, unpadded, one group: one batched GEMM over the images",
              why_operand_layout};
    }
    if (weight_grad_by_images(s, first)) {
      return {Route::pointwise_by_images, Layout::nchw,
              "1x1, stride 1, unpadded, one group: a batched GEMM of each image's product, "
              "summed in halves",
              "off the CPU (or TORCH_CONVBP_POINTWISE_WEIGHT_GRAD=by_images): products that "
              "cost less than copying the images, float32 or float64, within the workspace limit"};
    }
  }

  // The input gradient of stride 1 is a forward convolution (input_grad_convolution): the direct
  // grouped kernel computes it where that convolution's groups are narrow.
  const std::optional<ConvShape> transposed =
      op == Operator::input_grad ? input_grad_convolution(s) : std::optional<ConvShape>(s);
  if (transposed && has_narrow_groups(*transposed) &&
      (channels_last || grouped_pays_layout(op, *transposed, first))) {
    return {Route::grouped, Layout::nhwc,
            op == Operator::input_grad
                ? "stride 1, several groups of at most 32 input channels: direct kernels, no GEMM"
                : "several groups of at most 32 output channels: direct kernels, no GEMM",
            channels_last ? why_operand_layout
            : op == Operator::weight_grad
                ? "on the CPU, float32 on input planes of at most 1024 pixels, bfloat16 of at most "
                  "8 output channels per group: NHWC, through layout copies"
                : "on the CPU, float32 of at most 16 output channels per group, bfloat16 of at "
                  "most 4 on planes of at most 1024 pixels: NHWC, through layout copies"};
  }

  if (op == Operator::weight_grad && takes_implicit_weight_grad(s, first, channels_last)) {
    // fed NCHW: read as it is (its padded copies built from NCHW rows, NOTES sections 111, 112)
    return {Route::implicit_nhwc, operand_layout,
            "stride 1: a GEMM per tap on shifted views of padded copies of the input and the "
            "output gradient (no column matrix)",
            implicit_weight_grad_why(first, channels_last)};
  }
  if (op != Operator::weight_grad && transposed &&
      implicit_pays_layout(*transposed, first, channels_last) &&
      takes_implicit(*transposed, first, /*scatter=*/false)) {
    const bool kernel_rows = implicit_merges_kernel_rows(*transposed);
    const char* why_route =
        op == Operator::input_grad
            ? (kernel_rows ? "stride 1: the forward convolution of the output gradient, a GEMM per "
                             "kernel row (its taps one run of channels) on views of it (no "
                             "column matrix)"
                           : "stride 1: the forward convolution of the output gradient, a GEMM per "
                             "tap on views of it (no column matrix)")
            : (kernel_rows ? "a GEMM per kernel row (its taps one run of channels) on views of the "
                             "input (no column matrix)"
                           : "a GEMM per tap on views of the input (no column matrix)");
    return {Route::implicit_nhwc, Layout::nhwc, why_route,
            implicit_why_layout(first, channels_last)};
  }

  if (op == Operator::input_grad && !transposed &&
      takes_implicit_scatter(s, first, channels_last)) {
    return {Route::implicit_nhwc, Layout::nhwc,
            "stride above 1, or padding past the kernel's reach: a GEMM per tap on views of the "
            "output gradient, added into the input gradient's pixels it reaches (no column matrix, "
            "no col2im)",
            implicit_why_layout(first, channels_last)};
  }
  if (op == Operator::weight_grad && !channels_last && bfloat16_columns_pay_layout(op, s, first)) {
    return {Route::columns, Layout::nhwc, "im2col, then a GEMM",
            "bfloat16 on a CPU whose GEMM micro-kernel computes bfloat16; 16 or more input and "
            "output channels per group, more than one tap, output planes under 1024 pixels: NHWC, "
            "through layout copies"};
  }
  const bool nhwc = channels_last && has_wide_groups(s);
  const char* why_layout =
      nhwc ? "operands channels_last, groups of 16 or more channels"
           : (channels_last ? "groups narrower than 16 channels: NCHW, through layout copies"
                            : why_operand_layout);
  const Layout layout = nhwc ? Layout::nhwc : Layout::nchw;
  if (op != Operator::input_grad) {
    return {Route::columns, layout, "im2col, then a GEMM", why_layout};
  }
  const bool weight_read_as_is = transposed && input_grad_pays_col2im(s, first);
  if (transposed && !weight_read_as_is) {
    return {Route::transposed_columns, layout,
            "stride 1: the forward convolution of the output gradient (im2col, a GEMM)",
            why_layout};
  }
  const char* col2im =
      weight_read_as_is
          ? "stride 1, float32 on the CPU, a weight of at least as many elements as the output "
            "gradient: a GEMM that reads the weight as it is (no flipped copy), then col2im"
          : "stride above 1, or padding past the kernel's reach: a GEMM, then col2im";
  if (!channels_last && bfloat16_columns_pay_layout(op, s, first)) {
    return {Route::columns, Layout::nhwc, col2im,
            "bfloat16 on a CPU whose GEMM micro-kernel computes bfloat16; 32 or more input and 16 "
            "or more output channels per group, more than one tap: NHWC, through layout copies"};
  }
  if (nhwc && !has_wide_input_groups(s)) {
    return {Route::columns, Layout::nchw, col2im,
            "fewer than 16 input channels per group, which col2im would gather in runs that "
            "short: NCHW, through layout copies"};
  }
  return {Route::columns, layout, col2im, why_layout};
}

namespace {

// channels_last (channels_last_3d for volumes) where `suggested`, for an activation tensor of a
// non-empty batch off the meta device (F.conv2d's meta rule: contiguous), else contiguous.
at::MemoryFormat format_of_activation(const at::Tensor& activation, bool suggested) {
  const bool meta = activation.device().type() == c10::DeviceType::Meta;
  return (activation.dim() == 4 || activation.dim() == 5) && activation.size(0) > 0 && suggested &&
                 !meta
             ? channels_last_format(activation.dim())
             : at::MemoryFormat::Contiguous;
}

bool suggests_channels_last(const at::Tensor& t, int64_t rank) {
  return t.suggest_memory_format() == channels_last_format(rank);
}

}  // namespace

at::MemoryFormat result_format(const at::Tensor& activation, const at::Tensor& weight) {
  const int64_t rank = activation.dim();
  return format_of_activation(
      activation, suggests_channels_last(activation, rank) || suggests_channels_last(weight, rank));
}

at::MemoryFormat weight_grad_format(const at::Tensor& input) {
  return format_of_activation(input, suggests_channels_last(input, input.dim()));
}

bool implicit_merges_kernel_rows(const ConvShape& s) {
  return s.groups == 1 && s.dilation_w == 1 && s.kernel_w > 1 &&
         s.in_channels < kMinImplicitChannels;
}

const char* route_name(Route route) {
  switch (route) {
    case Route::columns: return "columns";
    case Route::transposed_columns: return "transposed_columns";
    case Route::pointwise_by_images: return "pointwise_by_images";
    case Route::pointwise_nhwc: return "pointwise_nhwc";
    case Route::implicit_nhwc: return "implicit_nhwc";
    case Route::depthwise: return "depthwise";
    case Route::grouped: return "grouped";
  }
  return "unknown";
}

const char* layout_name(Layout layout) { return layout == Layout::nhwc ? "nhwc" : "nchw"; }

}  // namespace torch_convbp
