// The switches that benchmarks, tests and users set through the environment (TORCH_CONVBP_GEMM,
// TORCH_CONVBP_HALF_GEMM, TORCH_CONVBP_POINTWISE_WEIGHT_GRAD, TORCH_CONVBP_CPU_DEPTHWISE_ORDER):
// each one word of a few.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>

namespace torch_convbp {

// "a, b or c"
inline std::string listed(std::initializer_list<std::string_view> words) {
  std::string text;
  for (auto it = words.begin(); it != words.end(); ++it) {
    if (it != words.begin()) text += std::next(it) == words.end() ? " or " : ", ";
    text += *it;
  }
  return text;
}

// The value of the environment variable `name`: one of `choices`, or the first of them where it
// is unset. Read on every call, so that a test can change it; any other value is refused by name.
inline std::string_view env_choice(const char* name,
                                   std::initializer_list<std::string_view> choices) {
  const char* text = std::getenv(name);
  const std::string_view choice = text ? text : *choices.begin();
  bool known = false;
  for (const std::string_view allowed : choices) known = known || choice == allowed;
  TORCH_CHECK(known, "torch_convbp: ", name, " must be ", listed(choices), ", got '", choice, "'");
  return choice;
}

}  // namespace torch_convbp
