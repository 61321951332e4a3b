#pragma once

// The umbrella header: everything stowage offers.

#include <stowage/activation/budget.h>
#include <stowage/activation/checkpoint.h>
#include <stowage/activation/policy.h>
#include <stowage/activation/sequential.h>
#include <stowage/activation/tensor_like.h>
#include <stowage/build_info.h>
#include <stowage/dcp/dcp.h>
#include <stowage/dist/gradient_reducer.h>
#include <stowage/dist/preemption.h>
#include <stowage/dist/process_group.h>
#include <stowage/dist/world.h>
#include <stowage/error.h>
#include <stowage/interop/open_checkpoint.h>
#include <stowage/interop/safetensors.h>
#include <stowage/interop/torch_dcp_reader.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/copy_engine.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/optim/master_adamw.h>
#include <stowage/optim/partition.h>
#include <stowage/optim/swap_config.h>
#include <stowage/optim/swap_optimizer.h>
#include <stowage/optim/zero_redundancy_optimizer.h>
#include <stowage/state/copy.h>
#include <stowage/state/destination.h>
#include <stowage/state/optimizer_adapter.h>
#include <stowage/state/optimizer_layout.h>
#include <stowage/state/state_dict.h>
#include <stowage/state/stateful.h>
#include <stowage/state/training_progress.h>
#include <stowage/train/events.h>
#include <stowage/train/run_directory.h>
#include <stowage/train/trainer.h>
#include <stowage/version.h>
