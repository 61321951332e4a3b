#pragma once

// stowage::dcp, the checkpoint engine: stagers, save, async_save and load.

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/dcp/metadata.h>
#include <stowage/dcp/planner.h>
#include <stowage/dcp/staging.h>
#include <stowage/dcp/storage.h>
