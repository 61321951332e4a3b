#pragma once

// Deprecated: PyTorch DCP's reader and open_checkpoint are in the interop library
// (link stowage::interop) and its headers, <stowage/interop/torch_dcp_reader.h> and
// <stowage/interop/open_checkpoint.h>. This header goes in the next release.

#include <stowage/interop/open_checkpoint.h>
#include <stowage/interop/torch_dcp_reader.h>
