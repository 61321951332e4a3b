#pragma once

// The umbrella header: everything stowage offers.

#include <stowage/dcp/dcp.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/state/copy.h>
#include <stowage/state/state_dict.h>
#include <stowage/state/stateful.h>
#include <stowage/version.h>
