#pragma once
/// @file pagedkv.hpp
/// Umbrella header: the whole public host API.

#include "pagedkv/attention.hpp"
#include "pagedkv/batch_metadata.hpp"
#include "pagedkv/block_allocator.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/contiguous_kv.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/eviction_policy.hpp"
#include "pagedkv/host_buffer.hpp"
#include "pagedkv/host_kv_cache.hpp"
#include "pagedkv/kv_cache_config.hpp"
#include "pagedkv/kv_cache_manager.hpp"
#include "pagedkv/kv_cache_stats.hpp"
#include "pagedkv/kv_layer_view.hpp"
#include "pagedkv/prefix_cache.hpp"
#include "pagedkv/reference.hpp"
#include "pagedkv/synchronized_manager.hpp"
#include "pagedkv/types.hpp"
