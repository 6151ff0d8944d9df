// The torch and standard headers most of the C++ files include, compiled once per build into a
// precompiled header (setup.py, with GCC) that every C++ file of the build then reads first: each
// file spent 6 to 10 of its seconds parsing them (benchmarks/NOTES.md, section 79). Each file
// still includes what it uses; this list changes nothing but the build's time.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>
