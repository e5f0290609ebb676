// The one seam between PyTorch 1.x and 2.x: what a backend derives from. In 1.13 a plug-in
// returns a c10d::ProcessGroup; from 2.0 a c10d::Backend, which torch wraps in a ProcessGroup.
#pragma once

#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 1
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define CHORUS_TORCH_2 1
namespace chorus_torch {
using PgBase = c10d::Backend;
}
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#define CHORUS_TORCH_2 0
namespace chorus_torch {
using PgBase = c10d::ProcessGroup;
}
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
