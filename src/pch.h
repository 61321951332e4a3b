// Precompiled header of the library, the tool, the tests and the benchmarks.
#pragma once
#include <torch/torch.h>
