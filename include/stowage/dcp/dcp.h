#pragma once

// stowage::dcp, the checkpoint engine: stagers, save, async_save and load, in one
// process or over a c10d process group.

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/env.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/dcp/metadata.h>
#include <stowage/dcp/planner.h>
#include <stowage/dcp/saveable_state.h>
#include <stowage/dcp/sharded_tensor.h>
#include <stowage/dcp/staging.h>
#include <stowage/dcp/storage.h>
#include <stowage/dcp/torch_dcp_reader.h>  // deprecated here: the interop library's (stowage::interop)
#include <stowage/dcp/verify.h>
