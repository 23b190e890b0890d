#pragma once
/// @file pagedkv.hpp
/// Umbrella header: the whole host API, layer by layer (docs/design.md has the map). The CUDA
/// backend's headers are under pagedkv/cuda/ and are included on their own.

/// @namespace pagedkv
/// Everything public: vocabulary, metadata (KVCacheManager), storage (HostKVCache), CPU kernels
/// and the reference. Internals live in pagedkv::detail and are not part of the API.

/// @namespace pagedkv::cuda
/// The CUDA backend: device storage (DeviceKVCache), launchers that take device pointers, and
/// DeviceDecodeRunner for host spans. Declared without CUDA headers; device_available(),
/// require_device() and device_info() work in every build, and device.hpp says what else needs
/// a build with PAGEDKV_WITH_CUDA 1.

// Vocabulary shared by every layer.
#include "pagedkv/attention_params.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/types.hpp"

// Metadata: block ids, tables, prefix caching, eviction, the block manager (host-only).
#include "pagedkv/metadata/append_result.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/metadata/block_allocator.hpp"
#include "pagedkv/metadata/eviction_policy.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/metadata/kv_cache_stats.hpp"
#include "pagedkv/metadata/prefix_cache.hpp"
#include "pagedkv/metadata/synchronized_manager.hpp"

// Storage: the pages themselves in host memory, their layout and views.
#include "pagedkv/storage/contiguous_paged_view.hpp"
#include "pagedkv/storage/host_buffer.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

// CPU kernels.
#include "pagedkv/cpu/attention.hpp"

// Reference (ground truth for tests).
#include "pagedkv/reference/reference_attention.hpp"
#include "pagedkv/reference/reference_kv_cache.hpp"
