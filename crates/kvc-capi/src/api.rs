//! `kvc_get_api`: the whole C API as one table of function pointers, so that a program
//! that loads kvc with `dlopen` needs a single `dlsym`.

use std::ffi::{c_char, c_int, c_void};

use crate::boundary::value_boundary;
use crate::codec::{
    kvc_codec_config_default, kvc_codec_decode, kvc_codec_decoded_size, kvc_codec_encode,
    kvc_codec_free, kvc_codec_max_encoded_size, kvc_codec_new,
};
use crate::codec::{KvcCodec, KvcCodecConfig, KvcTensor};
use crate::convert::{kvc_convert, kvc_dtype_size, KvcDtype};
use crate::h2o::{
    kvc_h2o_begin_call, kvc_h2o_config_default, kvc_h2o_end_call, kvc_h2o_free,
    kvc_h2o_get_layer_metrics, kvc_h2o_get_metrics, kvc_h2o_get_plan_info,
    kvc_h2o_ingest_block_sums, kvc_h2o_ingest_column_sums, kvc_h2o_ingest_probabilities,
    kvc_h2o_ingest_softmax_tile, kvc_h2o_new, kvc_h2o_plan_pairs,
};
use crate::h2o::{
    KvcH2o, KvcH2oCallShape, KvcH2oConfig, KvcH2oDecision, KvcH2oMetrics, KvcH2oPlanInfo,
    KvcReservePair,
};
use crate::kvq::{
    kvc_kvq_attend, kvc_kvq_block_bits, kvc_kvq_dequantize_rows, kvc_kvq_free,
    kvc_kvq_get_protections, kvc_kvq_new, kvc_kvq_new_from_plan, kvc_kvq_quantize_rows,
    kvc_kvq_row_bytes, kvc_kvq_shape, KvcKvq, KvcKvqProtections,
};
// ABI 0.8: kvq block formats without a handle (ggml type traits).
use crate::kvq_block::{
    kvc_kvq_block_accumulate_rows, kvc_kvq_block_bytes, kvc_kvq_block_dequantize,
    kvc_kvq_block_dequantize_rotated, kvc_kvq_block_dot, kvc_kvq_block_dot_rows,
    kvc_kvq_block_quantize, kvc_kvq_block_rotate, kvc_kvq_block_unrotate,
};
// ABI 0.9: several queries per tile (grouped-query attention).
use crate::kvq_block::{kvc_kvq_block_accumulate_rows_multi, kvc_kvq_block_dot_rows_multi};
use crate::kvq_cells::{
    kvc_kvq_cells_accumulate, kvc_kvq_cells_accumulate_tokens, kvc_kvq_cells_begin_ubatch,
    kvc_kvq_cells_bytes_held, kvc_kvq_cells_can_truncate, kvc_kvq_cells_capacity_bytes,
    kvc_kvq_cells_clear, kvc_kvq_cells_copy, kvc_kvq_cells_drop_ubatch, kvc_kvq_cells_free,
    kvc_kvq_cells_get_rows, kvc_kvq_cells_load, kvc_kvq_cells_main_cell_bytes, kvc_kvq_cells_new,
    kvc_kvq_cells_release, kvc_kvq_cells_save, kvc_kvq_cells_scores, kvc_kvq_cells_scores_tokens,
    kvc_kvq_cells_set_positions, kvc_kvq_cells_set_rollback, kvc_kvq_cells_set_rows,
    kvc_kvq_cells_truncate, kvc_kvq_cells_write, KvcKvqCells, KvcKvqCellsConfig, KvcKvqCellsTensor,
};
// ABI 0.12: symmetric, checkable kvq row calls (typed rows, checked dequantize, strided attend).
use crate::kvq_rows::{
    kvc_kvq_attend_strided, kvc_kvq_dequantize_rows_checked, kvc_kvq_dequantize_rows_typed,
    kvc_kvq_quantize_rows_typed,
};
// ABI 0.11: rows coded relative to a center per KV head.
use crate::kvq_center::{
    kvc_kvq_dequantize_rows_centered, kvc_kvq_mean_center, kvc_kvq_quantize_rows_centered,
};
// ABI 0.10: K per channel over token groups (KIVI).
use crate::kvq_channel::{
    kvc_kvq_channel_block_bytes, kvc_kvq_channel_dequantize, kvc_kvq_channel_dot,
    kvc_kvq_channel_quantize,
};
use crate::last_error::{kvc_last_error_message, set_last_error};
use crate::mlp::{
    kvc_mlp_compress_inplace, kvc_mlp_free, kvc_mlp_get_info, kvc_mlp_new, kvc_mlp_new_from_memory,
};
use crate::mlp::{KvcMlp, KvcMlpInfo};
// ABI 0.3: the quantizer and the cache view.
use crate::cache::{
    kvc_cache_compact_heads, kvc_cache_compact_layer, kvc_cache_config_default, kvc_cache_free,
    kvc_cache_get_info, kvc_cache_new, kvc_cache_zero_tokens,
};
use crate::cache::{KvcCache, KvcCacheConfig, KvcCacheInfo};
use crate::quant::{
    kvc_quant_config_default, kvc_quant_dequantize_rows, kvc_quant_finish, kvc_quant_free,
    kvc_quant_get_config, kvc_quant_get_params, kvc_quant_new, kvc_quant_new_from_msmodelslim,
    kvc_quant_observe_rows, kvc_quant_quantize_rows, kvc_quant_roundtrip_rows,
    kvc_quant_save_msmodelslim, kvc_quant_set_params, kvc_quant_set_rope, KvcRopeStyle,
};
use crate::quant::{KvcQuant, KvcQuantConfig};
use crate::status::{kvc_status_name, KvcStatus};
use crate::version::{kvc_abi_version, kvc_version, KVC_ABI_VERSION, KVC_ABI_VERSION_MAJOR};
// --- kvc_store (ABI 0.4) ---
use crate::store::{
    kvc_store_append_tokens, kvc_store_config_default, kvc_store_evict_decoded, kvc_store_free,
    kvc_store_get_metrics, kvc_store_new, kvc_store_poll, kvc_store_read_tokens,
    kvc_store_restore_layer, kvc_store_schedule, kvc_store_wait_idle,
};
use crate::store::{KvcStore, KvcStoreConfig, KvcStoreLayer, KvcStoreMetrics};
// --- kvc_tiers (ABI 0.7) ---
use crate::tiers::{
    kvc_tiers_config_default, kvc_tiers_free, kvc_tiers_get_metrics, kvc_tiers_hash_model_file,
    kvc_tiers_lookup, kvc_tiers_new, kvc_tiers_new_tc, kvc_tiers_restore, kvc_tiers_store,
};
// ABI 0.20: a prefix's chunks in one file (kv-prefix), for saved sequences.
use crate::tiers::{kvc_tiers_export_prefix, kvc_tiers_import_prefix};
use crate::tiers::{KvcTiers, KvcTiersConfig, KvcTiersMetrics, KvcTiersStoreReport};

/// The C API as function pointers; each field behaves exactly as the function of the
/// same name with the `kvc_` prefix (see there for ownership and threads).
///
/// The table is append-only within an ABI major version: fields are never removed or
/// reordered, new ones are added at the end and bump the ABI minor version. A table
/// returned for a requested version has at least the fields of that version;
/// `struct_size` says how many bytes the library's table really has.
#[repr(C)]
pub struct KvcApi {
    /// `sizeof(kvc_api)` in the library that returned the table.
    pub struct_size: usize,
    /// The library's ABI version, as `kvc_abi_version()` returns it.
    pub abi_version: u32,
    /// See `kvc_version`.
    pub version: extern "C" fn() -> *const c_char,
    /// See `kvc_status_name`.
    pub status_name: extern "C" fn(status: c_int) -> *const c_char,
    /// See `kvc_last_error_message`.
    pub last_error_message:
        unsafe extern "C" fn(buf: *mut c_char, capacity: usize, needed: *mut usize) -> KvcStatus,
    /// See `kvc_dtype_size`.
    pub dtype_size: extern "C" fn(dtype: KvcDtype) -> usize,
    /// See `kvc_convert`.
    pub convert: unsafe extern "C" fn(
        src_dtype: KvcDtype,
        src: *const c_void,
        count: usize,
        dst_dtype: KvcDtype,
        dst: *mut c_void,
        dst_capacity: usize,
        dst_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_codec_config_default` (ABI 0.2).
    pub codec_config_default: unsafe extern "C" fn(out: *mut KvcCodecConfig) -> KvcStatus,
    /// See `kvc_codec_new` (ABI 0.2).
    pub codec_new:
        unsafe extern "C" fn(config: *const KvcCodecConfig, out: *mut *mut KvcCodec) -> KvcStatus,
    /// See `kvc_codec_max_encoded_size` (ABI 0.2).
    pub codec_max_encoded_size: unsafe extern "C" fn(
        codec: *const KvcCodec,
        input_bytes: usize,
        out: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_codec_encode` (ABI 0.2).
    pub codec_encode: unsafe extern "C" fn(
        codec: *mut KvcCodec,
        tensor: KvcTensor,
        src: *const c_void,
        src_bytes: usize,
        dst: *mut c_void,
        dst_capacity: usize,
        dst_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_codec_decoded_size` (ABI 0.2).
    pub codec_decoded_size: unsafe extern "C" fn(
        codec: *const KvcCodec,
        blob: *const c_void,
        blob_bytes: usize,
        out: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_codec_decode` (ABI 0.2).
    pub codec_decode: unsafe extern "C" fn(
        codec: *mut KvcCodec,
        blob: *const c_void,
        blob_bytes: usize,
        dst: *mut c_void,
        dst_capacity: usize,
        dst_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_codec_free` (ABI 0.2).
    pub codec_free: unsafe extern "C" fn(codec: *mut KvcCodec),
    /// See `kvc_h2o_config_default` (ABI 0.2).
    pub h2o_config_default: unsafe extern "C" fn(out: *mut KvcH2oConfig) -> KvcStatus,
    /// See `kvc_h2o_new` (ABI 0.2).
    pub h2o_new: unsafe extern "C" fn(
        config: *const KvcH2oConfig,
        n_layers: usize,
        out: *mut *mut KvcH2o,
    ) -> KvcStatus,
    /// See `kvc_h2o_begin_call` (ABI 0.2).
    pub h2o_begin_call: unsafe extern "C" fn(
        h2o: *mut KvcH2o,
        layer: usize,
        shape: *const KvcH2oCallShape,
        resolution: *mut u32,
    ) -> KvcStatus,
    /// See `kvc_h2o_ingest_probabilities` (ABI 0.2).
    pub h2o_ingest_probabilities: unsafe extern "C" fn(
        h2o: *mut KvcH2o,
        layer: usize,
        data: *const f32,
        count: usize,
    ) -> KvcStatus,
    /// See `kvc_h2o_ingest_column_sums` (ABI 0.2).
    pub h2o_ingest_column_sums: unsafe extern "C" fn(
        h2o: *mut KvcH2o,
        layer: usize,
        data: *const f32,
        count: usize,
    ) -> KvcStatus,
    /// See `kvc_h2o_ingest_block_sums` (ABI 0.2).
    pub h2o_ingest_block_sums: unsafe extern "C" fn(
        h2o: *mut KvcH2o,
        layer: usize,
        data: *const f32,
        count: usize,
    ) -> KvcStatus,
    /// See `kvc_h2o_ingest_softmax_tile` (ABI 0.2).
    pub h2o_ingest_softmax_tile: unsafe extern "C" fn(
        h2o: *mut KvcH2o,
        layer: usize,
        head: usize,
        first_key: usize,
        n_keys: usize,
        rows: *const f32,
        rows_count: usize,
        n_rows: usize,
        row_stride: usize,
    ) -> KvcStatus,
    /// See `kvc_h2o_end_call` (ABI 0.2).
    pub h2o_end_call: unsafe extern "C" fn(
        h2o: *mut KvcH2o,
        layer: usize,
        decision: *mut KvcH2oDecision,
    ) -> KvcStatus,
    /// See `kvc_h2o_get_plan_info` (ABI 0.2).
    pub h2o_get_plan_info: unsafe extern "C" fn(
        h2o: *const KvcH2o,
        layer: usize,
        out: *mut KvcH2oPlanInfo,
    ) -> KvcStatus,
    /// See `kvc_h2o_plan_pairs` (ABI 0.2).
    pub h2o_plan_pairs: unsafe extern "C" fn(
        h2o: *const KvcH2o,
        layer: usize,
        group: usize,
        pairs: *mut KvcReservePair,
        capacity: usize,
        n_pairs: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_h2o_get_metrics` (ABI 0.2).
    pub h2o_get_metrics:
        unsafe extern "C" fn(h2o: *const KvcH2o, out: *mut KvcH2oMetrics) -> KvcStatus,
    /// See `kvc_h2o_get_layer_metrics` (ABI 0.2).
    pub h2o_get_layer_metrics: unsafe extern "C" fn(
        h2o: *const KvcH2o,
        layer: usize,
        out: *mut KvcH2oMetrics,
    ) -> KvcStatus,
    /// See `kvc_h2o_free` (ABI 0.2).
    pub h2o_free: unsafe extern "C" fn(h2o: *mut KvcH2o),
    /// See `kvc_mlp_new` (ABI 0.2).
    pub mlp_new: unsafe extern "C" fn(path: *const c_char, out: *mut *mut KvcMlp) -> KvcStatus,
    /// See `kvc_mlp_new_from_memory` (ABI 0.2).
    pub mlp_new_from_memory:
        unsafe extern "C" fn(bytes: *const c_void, len: usize, out: *mut *mut KvcMlp) -> KvcStatus,
    /// See `kvc_mlp_get_info` (ABI 0.2).
    pub mlp_get_info: unsafe extern "C" fn(mlp: *const KvcMlp, out: *mut KvcMlpInfo) -> KvcStatus,
    /// See `kvc_mlp_compress_inplace` (ABI 0.2).
    pub mlp_compress_inplace: unsafe extern "C" fn(
        mlp: *const KvcMlp,
        layer: usize,
        dtype: KvcDtype,
        k: *mut c_void,
        v: *mut c_void,
        n_heads: usize,
        capacity: usize,
        seq_len: usize,
        head_dim: usize,
        image_kv_len: usize,
        new_kv_len: *mut usize,
        rope_position: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_mlp_free` (ABI 0.2).
    pub mlp_free: unsafe extern "C" fn(mlp: *mut KvcMlp),
    // ---- ABI 0.3: the quantizer (kvc_quant) and the cache view (kvc_cache). ----
    /// See `kvc_quant_config_default` (ABI 0.3).
    pub quant_config_default: unsafe extern "C" fn(out: *mut KvcQuantConfig) -> KvcStatus,
    /// See `kvc_quant_new` (ABI 0.3).
    pub quant_new:
        unsafe extern "C" fn(config: *const KvcQuantConfig, out: *mut *mut KvcQuant) -> KvcStatus,
    /// See `kvc_quant_new_from_msmodelslim` (ABI 0.3).
    pub quant_new_from_msmodelslim:
        unsafe extern "C" fn(dir: *const c_char, out: *mut *mut KvcQuant) -> KvcStatus,
    /// See `kvc_quant_save_msmodelslim` (ABI 0.3).
    pub quant_save_msmodelslim: unsafe extern "C" fn(
        quant: *const KvcQuant,
        dir: *const c_char,
        scale_dtype: KvcDtype,
    ) -> KvcStatus,
    /// See `kvc_quant_get_config` (ABI 0.3).
    pub quant_get_config:
        unsafe extern "C" fn(quant: *const KvcQuant, out: *mut KvcQuantConfig) -> KvcStatus,
    /// See `kvc_quant_observe_rows` (ABI 0.3).
    pub quant_observe_rows: unsafe extern "C" fn(
        quant: *mut KvcQuant,
        layer: usize,
        tensor: KvcTensor,
        dtype: KvcDtype,
        src: *const c_void,
        n_rows: usize,
    ) -> KvcStatus,
    /// See `kvc_quant_finish` (ABI 0.3).
    pub quant_finish: unsafe extern "C" fn(quant: *mut KvcQuant) -> KvcStatus,
    /// See `kvc_quant_set_params` (ABI 0.3).
    pub quant_set_params: unsafe extern "C" fn(
        quant: *mut KvcQuant,
        layer: usize,
        tensor: KvcTensor,
        scale: *const f32,
        offset: *const f32,
        n_channels: usize,
    ) -> KvcStatus,
    /// See `kvc_quant_get_params` (ABI 0.3).
    pub quant_get_params: unsafe extern "C" fn(
        quant: *const KvcQuant,
        layer: usize,
        tensor: KvcTensor,
        scale: *mut f32,
        offset: *mut f32,
        capacity: usize,
        n_channels: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_quant_quantize_rows` (ABI 0.3).
    pub quant_quantize_rows: unsafe extern "C" fn(
        quant: *const KvcQuant,
        layer: usize,
        tensor: KvcTensor,
        dtype: KvcDtype,
        src: *const c_void,
        n_rows: usize,
        dst: *mut i8,
        dst_capacity: usize,
        dst_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_quant_dequantize_rows` (ABI 0.3).
    pub quant_dequantize_rows: unsafe extern "C" fn(
        quant: *const KvcQuant,
        layer: usize,
        tensor: KvcTensor,
        src: *const i8,
        n_rows: usize,
        dtype: KvcDtype,
        dst: *mut c_void,
        dst_capacity: usize,
        dst_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_quant_roundtrip_rows` (ABI 0.3).
    pub quant_roundtrip_rows: unsafe extern "C" fn(
        quant: *const KvcQuant,
        layer: usize,
        tensor: KvcTensor,
        dtype: KvcDtype,
        data: *mut c_void,
        n_rows: usize,
    ) -> KvcStatus,
    /// See `kvc_quant_free` (ABI 0.3).
    pub quant_free: unsafe extern "C" fn(quant: *mut KvcQuant),
    /// See `kvc_cache_config_default` (ABI 0.3).
    pub cache_config_default: unsafe extern "C" fn(out: *mut KvcCacheConfig) -> KvcStatus,
    /// See `kvc_cache_new` (ABI 0.3).
    pub cache_new:
        unsafe extern "C" fn(config: *const KvcCacheConfig, out: *mut *mut KvcCache) -> KvcStatus,
    /// See `kvc_cache_get_info` (ABI 0.3).
    pub cache_get_info:
        unsafe extern "C" fn(cache: *const KvcCache, out: *mut KvcCacheInfo) -> KvcStatus,
    /// See `kvc_cache_compact_layer` (ABI 0.3).
    pub cache_compact_layer: unsafe extern "C" fn(
        cache: *const KvcCache,
        k: *mut c_void,
        v: *mut c_void,
        pairs: *const KvcReservePair,
        n_pairs: usize,
        len: usize,
        new_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_cache_compact_heads` (ABI 0.3).
    pub cache_compact_heads: unsafe extern "C" fn(
        cache: *const KvcCache,
        k: *mut c_void,
        v: *mut c_void,
        pairs: *const KvcReservePair,
        n_pairs: usize,
        head_pair_counts: *const usize,
        n_heads: usize,
        len: usize,
        new_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_cache_zero_tokens` (ABI 0.3).
    pub cache_zero_tokens: unsafe extern "C" fn(
        cache: *const KvcCache,
        k: *mut c_void,
        v: *mut c_void,
        start: usize,
        end: usize,
    ) -> KvcStatus,
    /// See `kvc_cache_free` (ABI 0.3).
    pub cache_free: unsafe extern "C" fn(cache: *mut KvcCache),
    // --- kvc_store (ABI 0.4) ---
    /// See `kvc_store_config_default` (ABI 0.4).
    pub store_config_default: unsafe extern "C" fn(out: *mut KvcStoreConfig) -> KvcStatus,
    /// See `kvc_store_new` (ABI 0.4).
    pub store_new: unsafe extern "C" fn(
        config: *const KvcStoreConfig,
        layers: *const KvcStoreLayer,
        n_layers: usize,
        out: *mut *mut KvcStore,
    ) -> KvcStatus,
    /// See `kvc_store_append_tokens` (ABI 0.4).
    pub store_append_tokens: unsafe extern "C" fn(
        store: *const KvcStore,
        layer: usize,
        k: *const u8,
        k_bytes: usize,
        v: *const u8,
        v_bytes: usize,
        new_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_store_schedule` (ABI 0.4).
    pub store_schedule: unsafe extern "C" fn(
        store: *const KvcStore,
        layer: usize,
        handled: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_store_poll` (ABI 0.4).
    pub store_poll: unsafe extern "C" fn(store: *const KvcStore, finished: *mut usize) -> KvcStatus,
    /// See `kvc_store_wait_idle` (ABI 0.4).
    pub store_wait_idle: unsafe extern "C" fn(store: *const KvcStore) -> KvcStatus,
    /// See `kvc_store_read_tokens` (ABI 0.4).
    pub store_read_tokens: unsafe extern "C" fn(
        store: *const KvcStore,
        layer: usize,
        start: usize,
        end: usize,
        k_dst: *mut u8,
        k_capacity: usize,
        v_dst: *mut u8,
        v_capacity: usize,
        k_len: *mut usize,
        v_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_store_restore_layer` (ABI 0.4).
    pub store_restore_layer: unsafe extern "C" fn(
        store: *const KvcStore,
        layer: usize,
        decoded: *mut usize,
        hits: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_store_evict_decoded` (ABI 0.4).
    pub store_evict_decoded:
        unsafe extern "C" fn(store: *const KvcStore, layer: i64, released: *mut usize) -> KvcStatus,
    /// See `kvc_store_get_metrics` (ABI 0.4).
    pub store_get_metrics:
        unsafe extern "C" fn(store: *const KvcStore, out: *mut KvcStoreMetrics) -> KvcStatus,
    /// See `kvc_store_free` (ABI 0.4).
    pub store_free: unsafe extern "C" fn(store: *mut KvcStore),
    // --- RoPE-aware C8 calibration (ABI 0.5) ---
    /// See `kvc_quant_set_rope` (ABI 0.5).
    pub quant_set_rope: unsafe extern "C" fn(
        quant: *mut KvcQuant,
        head_dim: usize,
        style: KvcRopeStyle,
    ) -> KvcStatus,
    // --- kvq packed rows (ABI 0.6) ---
    /// See `kvc_kvq_new` (ABI 0.6).
    pub kvq_new: unsafe extern "C" fn(
        config: *const c_char,
        head_dim: u32,
        n_layer: u32,
        n_kv_head: u32,
        out: *mut *mut KvcKvq,
    ) -> KvcStatus,
    /// See `kvc_kvq_new_from_plan` (ABI 0.6).
    pub kvq_new_from_plan:
        unsafe extern "C" fn(json: *const c_char, len: usize, out: *mut *mut KvcKvq) -> KvcStatus,
    /// See `kvc_kvq_row_bytes` (ABI 0.6).
    pub kvq_row_bytes: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        tensor: KvcTensor,
        out: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_quantize_rows` (ABI 0.6).
    pub kvq_quantize_rows: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        tensor: KvcTensor,
        src: *const f32,
        n_rows: usize,
        dst: *mut u8,
        dst_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_dequantize_rows` (ABI 0.6).
    pub kvq_dequantize_rows: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        tensor: KvcTensor,
        src: *const u8,
        src_len: usize,
        dst: *mut f32,
        n_rows: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_attend` (ABI 0.6).
    pub kvq_attend: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        q: *const f32,
        n_head: u32,
        k: *const u8,
        k_len: usize,
        v: *const u8,
        v_len: usize,
        n_tokens: usize,
        scale: f32,
        scores: *mut f32,
        scores_len: usize,
        out: *mut f32,
    ) -> KvcStatus,
    /// See `kvc_kvq_free` (ABI 0.6).
    pub kvq_free: unsafe extern "C" fn(kvq: *mut KvcKvq),
    // --- kvc_tiers (ABI 0.7) ---
    /// See `kvc_tiers_config_default` (ABI 0.7).
    pub tiers_config_default: unsafe extern "C" fn(out: *mut KvcTiersConfig) -> KvcStatus,
    /// See `kvc_tiers_hash_model_file` (ABI 0.7).
    pub tiers_hash_model_file:
        unsafe extern "C" fn(path: *const c_char, out_hash: *mut u8) -> KvcStatus,
    /// See `kvc_tiers_new` (ABI 0.7).
    pub tiers_new:
        unsafe extern "C" fn(config: *const KvcTiersConfig, out: *mut *mut KvcTiers) -> KvcStatus,
    /// See `kvc_tiers_lookup` (ABI 0.7).
    pub tiers_lookup: unsafe extern "C" fn(
        tiers: *const KvcTiers,
        tokens: *const u32,
        n_tokens: usize,
        out_tokens: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_tiers_restore` (ABI 0.7).
    pub tiers_restore: unsafe extern "C" fn(
        tiers: *const KvcTiers,
        tokens: *const u32,
        n_tokens: usize,
        kv_tokens: usize,
        k: *mut c_void,
        k_len: usize,
        v: *mut c_void,
        v_len: usize,
        out_tokens: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_tiers_store` (ABI 0.7).
    pub tiers_store: unsafe extern "C" fn(
        tiers: *const KvcTiers,
        tokens: *const u32,
        n_tokens: usize,
        kv_tokens: usize,
        k: *const c_void,
        k_len: usize,
        v: *const c_void,
        v_len: usize,
        out_report: *mut KvcTiersStoreReport,
    ) -> KvcStatus,
    /// See `kvc_tiers_get_metrics` (ABI 0.7).
    pub tiers_get_metrics:
        unsafe extern "C" fn(tiers: *const KvcTiers, out: *mut KvcTiersMetrics) -> KvcStatus,
    /// See `kvc_tiers_free` (ABI 0.7).
    pub tiers_free: unsafe extern "C" fn(tiers: *mut KvcTiers),
    // --- kvq shape, block bits and block formats (ABI 0.8) ---
    /// See `kvc_kvq_shape` (ABI 0.8).
    pub kvq_shape: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        n_layer: *mut u32,
        n_kv_head: *mut u32,
        head_dim: *mut u32,
    ) -> KvcStatus,
    /// See `kvc_kvq_block_bits` (ABI 0.8).
    pub kvq_block_bits: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        tensor: KvcTensor,
        bits: *mut u32,
    ) -> KvcStatus,
    /// See `kvc_kvq_block_bytes` (ABI 0.8).
    pub kvq_block_bytes:
        unsafe extern "C" fn(head_dim: u32, bits: u32, out: *mut usize) -> KvcStatus,
    /// See `kvc_kvq_block_quantize` (ABI 0.8).
    pub kvq_block_quantize: unsafe extern "C" fn(
        head_dim: u32,
        bits: u32,
        src: *const f32,
        n_values: usize,
        dst: *mut u8,
        dst_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_block_dequantize` (ABI 0.8).
    pub kvq_block_dequantize: unsafe extern "C" fn(
        head_dim: u32,
        bits: u32,
        src: *const u8,
        src_len: usize,
        dst: *mut f32,
        n_values: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_block_dequantize_rotated` (ABI 0.8).
    pub kvq_block_dequantize_rotated: unsafe extern "C" fn(
        head_dim: u32,
        bits: u32,
        src: *const u8,
        src_len: usize,
        dst: *mut f32,
        n_values: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_block_rotate` (ABI 0.8).
    pub kvq_block_rotate:
        unsafe extern "C" fn(head_dim: u32, x: *mut f32, n_values: usize) -> KvcStatus,
    /// See `kvc_kvq_block_unrotate` (ABI 0.8).
    pub kvq_block_unrotate:
        unsafe extern "C" fn(head_dim: u32, x: *mut f32, n_values: usize) -> KvcStatus,
    /// See `kvc_kvq_block_dot` (ABI 0.8).
    pub kvq_block_dot: unsafe extern "C" fn(
        head_dim: u32,
        bits: u32,
        packed: *const u8,
        packed_len: usize,
        q_rot: *const f32,
        n_values: usize,
        out: *mut f32,
    ) -> KvcStatus,
    /// See `kvc_kvq_block_dot_rows` (ABI 0.8).
    pub kvq_block_dot_rows: unsafe extern "C" fn(
        head_dim: u32,
        bits: u32,
        packed: *const u8,
        stride: usize,
        n_rows: usize,
        q_rot: *const f32,
        scores: *mut f32,
    ) -> KvcStatus,
    /// See `kvc_kvq_block_accumulate_rows` (ABI 0.8).
    pub kvq_block_accumulate_rows: unsafe extern "C" fn(
        head_dim: u32,
        bits: u32,
        packed: *const u8,
        stride: usize,
        n_rows: usize,
        weights: *const f32,
        acc: *mut f32,
    ) -> KvcStatus,
    /// See `kvc_kvq_block_dot_rows_multi` (ABI 0.9).
    pub kvq_block_dot_rows_multi: unsafe extern "C" fn(
        head_dim: u32,
        bits: u32,
        packed: *const u8,
        stride: usize,
        n_rows: usize,
        q_rot: *const f32,
        n_queries: usize,
        scores: *mut f32,
    ) -> KvcStatus,
    /// See `kvc_kvq_block_accumulate_rows_multi` (ABI 0.9).
    pub kvq_block_accumulate_rows_multi: unsafe extern "C" fn(
        head_dim: u32,
        bits: u32,
        packed: *const u8,
        stride: usize,
        n_rows: usize,
        weights: *const f32,
        n_queries: usize,
        acc: *mut f32,
    ) -> KvcStatus,
    /// See `kvc_kvq_channel_block_bytes` (ABI 0.10).
    pub kvq_channel_block_bytes:
        unsafe extern "C" fn(bits: u32, head_dim: u32, group: u32, out: *mut usize) -> KvcStatus,
    /// See `kvc_kvq_channel_quantize` (ABI 0.10).
    pub kvq_channel_quantize: unsafe extern "C" fn(
        bits: u32,
        head_dim: u32,
        group: u32,
        rows: *const f32,
        dst: *mut u8,
        dst_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_channel_dequantize` (ABI 0.10).
    pub kvq_channel_dequantize: unsafe extern "C" fn(
        bits: u32,
        head_dim: u32,
        group: u32,
        src: *const u8,
        src_len: usize,
        dst: *mut f32,
    ) -> KvcStatus,
    /// See `kvc_kvq_channel_dot` (ABI 0.10).
    pub kvq_channel_dot: unsafe extern "C" fn(
        bits: u32,
        head_dim: u32,
        group: u32,
        q: *const f32,
        src: *const u8,
        src_len: usize,
        scores: *mut f32,
    ) -> KvcStatus,
    /// See `kvc_kvq_quantize_rows_centered` (ABI 0.11).
    pub kvq_quantize_rows_centered: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        tensor: KvcTensor,
        src: *const f32,
        n_rows: usize,
        center: *const f32,
        center_len: usize,
        dst: *mut u8,
        dst_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_dequantize_rows_centered` (ABI 0.11).
    pub kvq_dequantize_rows_centered: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        tensor: KvcTensor,
        src: *const u8,
        src_len: usize,
        center: *const f32,
        center_len: usize,
        dst: *mut f32,
        n_rows: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_mean_center` (ABI 0.11).
    pub kvq_mean_center: unsafe extern "C" fn(
        rows: *const f32,
        n_values: usize,
        n_kv_head: u32,
        head_dim: u32,
        out: *mut f32,
        out_len: usize,
    ) -> KvcStatus,
    // --- kvq symmetric row calls (ABI 0.12) ---
    /// See `kvc_kvq_dequantize_rows_checked` (ABI 0.12).
    pub kvq_dequantize_rows_checked: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        tensor: KvcTensor,
        src: *const u8,
        src_len: usize,
        n_rows: usize,
        dst: *mut f32,
        dst_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_quantize_rows_typed` (ABI 0.12).
    pub kvq_quantize_rows_typed: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        tensor: KvcTensor,
        dtype: KvcDtype,
        src: *const c_void,
        n_rows: usize,
        dst: *mut u8,
        dst_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_dequantize_rows_typed` (ABI 0.12).
    pub kvq_dequantize_rows_typed: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        tensor: KvcTensor,
        src: *const u8,
        src_len: usize,
        n_rows: usize,
        dtype: KvcDtype,
        dst: *mut c_void,
        dst_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_attend_strided` (ABI 0.12).
    pub kvq_attend_strided: unsafe extern "C" fn(
        kvq: *const KvcKvq,
        layer: u32,
        q: *const f32,
        n_head: u32,
        k: *const u8,
        k_len: usize,
        k_token_stride: usize,
        k_head_stride: usize,
        v: *const u8,
        v_len: usize,
        v_token_stride: usize,
        v_head_stride: usize,
        n_tokens: usize,
        scale: f32,
        scores: *mut f32,
        scores_len: usize,
        out: *mut f32,
    ) -> KvcStatus,
    // --- the transform coder of the tiers (ABI 0.13) ---
    /// See `kvc_tiers_new_tc` (ABI 0.13).
    pub tiers_new_tc: unsafe extern "C" fn(
        config: *const KvcTiersConfig,
        codec_name: *const c_char,
        calibration_path: *const c_char,
        out: *mut *mut KvcTiers,
    ) -> KvcStatus,
    // --- kvq cells: sink, window and centers in an engine's cache (ABI 0.14) ---
    /// See `kvc_kvq_get_protections` (ABI 0.14).
    pub kvq_get_protections:
        unsafe extern "C" fn(kvq: *const KvcKvq, out: *mut KvcKvqProtections) -> KvcStatus,
    /// See `kvc_kvq_cells_new` (ABI 0.14).
    pub kvq_cells_new: unsafe extern "C" fn(
        config: *const KvcKvqCellsConfig,
        tensors: *const KvcKvqCellsTensor,
        n_tensors: usize,
        out: *mut *mut KvcKvqCells,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_main_cell_bytes` (ABI 0.14).
    pub kvq_cells_main_cell_bytes:
        unsafe extern "C" fn(cells: *const KvcKvqCells, tensor: u32, out: *mut usize) -> KvcStatus,
    /// See `kvc_kvq_cells_bytes_held` (ABI 0.14).
    pub kvq_cells_bytes_held:
        unsafe extern "C" fn(cells: *const KvcKvqCells, tensor: u32, out: *mut usize) -> KvcStatus,
    /// See `kvc_kvq_cells_begin_ubatch` (ABI 0.14).
    pub kvq_cells_begin_ubatch: unsafe extern "C" fn(
        cells: *mut KvcKvqCells,
        pos: *const i32,
        seq: *const i32,
        cell_idx: *const i64,
        n: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_write` (ABI 0.14).
    pub kvq_cells_write: unsafe extern "C" fn(
        cells: *mut KvcKvqCells,
        tensor: u32,
        rows: *const f32,
        n_values: usize,
        cell_idx: *const i64,
        n_rows: usize,
        main: *mut u8,
        main_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_scores` (ABI 0.14).
    pub kvq_cells_scores: unsafe extern "C" fn(
        cells: *const KvcKvqCells,
        tensor: u32,
        main: *const u8,
        main_len: usize,
        kv_head: u32,
        cell0: u32,
        n: usize,
        token: u32,
        q_rot: *const f32,
        n_queries: usize,
        scores: *mut f32,
        scores_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_accumulate` (ABI 0.14).
    pub kvq_cells_accumulate: unsafe extern "C" fn(
        cells: *const KvcKvqCells,
        tensor: u32,
        main: *const u8,
        main_len: usize,
        kv_head: u32,
        cell0: u32,
        n: usize,
        token: u32,
        w: *const f32,
        w_len: usize,
        n_queries: usize,
        acc: *mut f32,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_release` (ABI 0.14).
    pub kvq_cells_release: unsafe extern "C" fn(cells: *mut KvcKvqCells, cell: u32) -> KvcStatus,
    /// See `kvc_kvq_cells_clear` (ABI 0.14).
    pub kvq_cells_clear: unsafe extern "C" fn(cells: *mut KvcKvqCells) -> KvcStatus,
    /// See `kvc_kvq_cells_copy` (ABI 0.14).
    pub kvq_cells_copy: unsafe extern "C" fn(
        cells: *mut KvcKvqCells,
        src0: u32,
        dst0: u32,
        n: u32,
        dst_seq: i32,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_free` (ABI 0.14).
    pub kvq_cells_free: unsafe extern "C" fn(cells: *mut KvcKvqCells),
    /// See `kvc_kvq_cells_save` (ABI 0.15).
    pub kvq_cells_save: unsafe extern "C" fn(
        cells: *const KvcKvqCells,
        cell_ids: *const u32,
        n: usize,
        seq: i32,
        dst: *mut u8,
        dst_capacity: usize,
        dst_len: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_load` (ABI 0.15).
    pub kvq_cells_load: unsafe extern "C" fn(
        cells: *mut KvcKvqCells,
        src: *const u8,
        src_len: usize,
        cell_ids: *const u32,
        pos: *const i32,
        n: usize,
        dest_seq: i32,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_get_rows` (ABI 0.15).
    pub kvq_cells_get_rows: unsafe extern "C" fn(
        cells: *const KvcKvqCells,
        tensor: u32,
        main: *const u8,
        main_len: usize,
        cell_ids: *const u32,
        n: usize,
        out: *mut f32,
        out_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_set_rows` (ABI 0.15).
    pub kvq_cells_set_rows: unsafe extern "C" fn(
        cells: *mut KvcKvqCells,
        tensor: u32,
        main: *mut u8,
        main_len: usize,
        cell_ids: *const u32,
        n: usize,
        rows: *const f32,
        rows_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_set_positions` (ABI 0.15).
    pub kvq_cells_set_positions: unsafe extern "C" fn(
        cells: *mut KvcKvqCells,
        cell_ids: *const u32,
        pos: *const i32,
        n: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_drop_ubatch` (ABI 0.16).
    pub kvq_cells_drop_ubatch:
        unsafe extern "C" fn(cells: *mut KvcKvqCells, dropped: *mut c_int) -> KvcStatus,
    /// See `kvc_kvq_cells_capacity_bytes` (ABI 0.17).
    pub kvq_cells_capacity_bytes: unsafe extern "C" fn(
        cells: *const KvcKvqCells,
        n_seqs: u32,
        n_ubatch: u32,
        out: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_set_rollback` (ABI 0.18).
    pub kvq_cells_set_rollback: unsafe extern "C" fn(cells: *mut KvcKvqCells, n: u32) -> KvcStatus,
    /// See `kvc_kvq_cells_truncate` (ABI 0.18).
    pub kvq_cells_truncate: unsafe extern "C" fn(
        cells: *mut KvcKvqCells,
        seq: i32,
        p0: i32,
        exact: *mut c_int,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_can_truncate` (ABI 0.18).
    pub kvq_cells_can_truncate: unsafe extern "C" fn(
        cells: *const KvcKvqCells,
        seq: i32,
        p0: i32,
        exact: *mut c_int,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_scores_tokens` (ABI 0.19).
    pub kvq_cells_scores_tokens: unsafe extern "C" fn(
        cells: *const KvcKvqCells,
        tensor: u32,
        main: *const u8,
        main_len: usize,
        kv_head: u32,
        cell0: u32,
        n: usize,
        tokens: *const u32,
        n_tokens: usize,
        q_rot: *const f32,
        n_queries: usize,
        scores: *mut f32,
        scores_len: usize,
    ) -> KvcStatus,
    /// See `kvc_kvq_cells_accumulate_tokens` (ABI 0.19).
    pub kvq_cells_accumulate_tokens: unsafe extern "C" fn(
        cells: *const KvcKvqCells,
        tensor: u32,
        main: *const u8,
        main_len: usize,
        kv_head: u32,
        cell0: u32,
        n: usize,
        tokens: *const u32,
        n_tokens: usize,
        w: *const f32,
        w_len: usize,
        n_queries: usize,
        acc: *mut f32,
    ) -> KvcStatus,
    // --- kv-prefix files (ABI 0.20) ---
    /// See `kvc_tiers_export_prefix` (ABI 0.20).
    pub tiers_export_prefix: unsafe extern "C" fn(
        tiers: *const KvcTiers,
        tokens: *const u32,
        n_tokens: usize,
        path: *const c_char,
        out_tokens: *mut usize,
    ) -> KvcStatus,
    /// See `kvc_tiers_import_prefix` (ABI 0.20).
    pub tiers_import_prefix: unsafe extern "C" fn(
        tiers: *const KvcTiers,
        path: *const c_char,
        tokens: *mut u32,
        capacity: usize,
        out_n_tokens: *mut usize,
        out_chunk_tokens_imported: *mut usize,
    ) -> KvcStatus,
}

static API: KvcApi = KvcApi {
    struct_size: std::mem::size_of::<KvcApi>(),
    abi_version: KVC_ABI_VERSION,
    version: kvc_version,
    status_name: kvc_status_name,
    last_error_message: kvc_last_error_message,
    dtype_size: kvc_dtype_size,
    convert: kvc_convert,
    codec_config_default: kvc_codec_config_default,
    codec_new: kvc_codec_new,
    codec_max_encoded_size: kvc_codec_max_encoded_size,
    codec_encode: kvc_codec_encode,
    codec_decoded_size: kvc_codec_decoded_size,
    codec_decode: kvc_codec_decode,
    codec_free: kvc_codec_free,
    h2o_config_default: kvc_h2o_config_default,
    h2o_new: kvc_h2o_new,
    h2o_begin_call: kvc_h2o_begin_call,
    h2o_ingest_probabilities: kvc_h2o_ingest_probabilities,
    h2o_ingest_column_sums: kvc_h2o_ingest_column_sums,
    h2o_ingest_block_sums: kvc_h2o_ingest_block_sums,
    h2o_ingest_softmax_tile: kvc_h2o_ingest_softmax_tile,
    h2o_end_call: kvc_h2o_end_call,
    h2o_get_plan_info: kvc_h2o_get_plan_info,
    h2o_plan_pairs: kvc_h2o_plan_pairs,
    h2o_get_metrics: kvc_h2o_get_metrics,
    h2o_get_layer_metrics: kvc_h2o_get_layer_metrics,
    h2o_free: kvc_h2o_free,
    mlp_new: kvc_mlp_new,
    mlp_new_from_memory: kvc_mlp_new_from_memory,
    mlp_get_info: kvc_mlp_get_info,
    mlp_compress_inplace: kvc_mlp_compress_inplace,
    mlp_free: kvc_mlp_free,
    // ABI 0.3: the quantizer and the cache view.
    quant_config_default: kvc_quant_config_default,
    quant_new: kvc_quant_new,
    quant_new_from_msmodelslim: kvc_quant_new_from_msmodelslim,
    quant_save_msmodelslim: kvc_quant_save_msmodelslim,
    quant_get_config: kvc_quant_get_config,
    quant_observe_rows: kvc_quant_observe_rows,
    quant_finish: kvc_quant_finish,
    quant_set_params: kvc_quant_set_params,
    quant_get_params: kvc_quant_get_params,
    quant_quantize_rows: kvc_quant_quantize_rows,
    quant_dequantize_rows: kvc_quant_dequantize_rows,
    quant_roundtrip_rows: kvc_quant_roundtrip_rows,
    quant_free: kvc_quant_free,
    cache_config_default: kvc_cache_config_default,
    cache_new: kvc_cache_new,
    cache_get_info: kvc_cache_get_info,
    cache_compact_layer: kvc_cache_compact_layer,
    cache_compact_heads: kvc_cache_compact_heads,
    cache_zero_tokens: kvc_cache_zero_tokens,
    cache_free: kvc_cache_free,
    // --- kvc_store (ABI 0.4) ---
    store_config_default: kvc_store_config_default,
    store_new: kvc_store_new,
    store_append_tokens: kvc_store_append_tokens,
    store_schedule: kvc_store_schedule,
    store_poll: kvc_store_poll,
    store_wait_idle: kvc_store_wait_idle,
    store_read_tokens: kvc_store_read_tokens,
    store_restore_layer: kvc_store_restore_layer,
    store_evict_decoded: kvc_store_evict_decoded,
    store_get_metrics: kvc_store_get_metrics,
    store_free: kvc_store_free,
    // --- RoPE-aware C8 calibration (ABI 0.5) ---
    quant_set_rope: kvc_quant_set_rope,
    // --- kvq packed rows (ABI 0.6) ---
    kvq_new: kvc_kvq_new,
    kvq_new_from_plan: kvc_kvq_new_from_plan,
    kvq_row_bytes: kvc_kvq_row_bytes,
    kvq_quantize_rows: kvc_kvq_quantize_rows,
    kvq_dequantize_rows: kvc_kvq_dequantize_rows,
    kvq_attend: kvc_kvq_attend,
    kvq_free: kvc_kvq_free,
    // --- kvc_tiers (ABI 0.7) ---
    tiers_config_default: kvc_tiers_config_default,
    tiers_hash_model_file: kvc_tiers_hash_model_file,
    tiers_new: kvc_tiers_new,
    tiers_lookup: kvc_tiers_lookup,
    tiers_restore: kvc_tiers_restore,
    tiers_store: kvc_tiers_store,
    tiers_get_metrics: kvc_tiers_get_metrics,
    tiers_free: kvc_tiers_free,
    // --- kvq shape, block bits and block formats (ABI 0.8) ---
    kvq_shape: kvc_kvq_shape,
    kvq_block_bits: kvc_kvq_block_bits,
    kvq_block_bytes: kvc_kvq_block_bytes,
    kvq_block_quantize: kvc_kvq_block_quantize,
    kvq_block_dequantize: kvc_kvq_block_dequantize,
    kvq_block_dequantize_rotated: kvc_kvq_block_dequantize_rotated,
    kvq_block_rotate: kvc_kvq_block_rotate,
    kvq_block_unrotate: kvc_kvq_block_unrotate,
    kvq_block_dot: kvc_kvq_block_dot,
    kvq_block_dot_rows: kvc_kvq_block_dot_rows,
    kvq_block_accumulate_rows: kvc_kvq_block_accumulate_rows,
    kvq_block_dot_rows_multi: kvc_kvq_block_dot_rows_multi,
    kvq_block_accumulate_rows_multi: kvc_kvq_block_accumulate_rows_multi,
    kvq_channel_block_bytes: kvc_kvq_channel_block_bytes,
    kvq_channel_quantize: kvc_kvq_channel_quantize,
    kvq_channel_dequantize: kvc_kvq_channel_dequantize,
    kvq_channel_dot: kvc_kvq_channel_dot,
    kvq_quantize_rows_centered: kvc_kvq_quantize_rows_centered,
    kvq_dequantize_rows_centered: kvc_kvq_dequantize_rows_centered,
    kvq_mean_center: kvc_kvq_mean_center,
    kvq_dequantize_rows_checked: kvc_kvq_dequantize_rows_checked,
    kvq_quantize_rows_typed: kvc_kvq_quantize_rows_typed,
    kvq_dequantize_rows_typed: kvc_kvq_dequantize_rows_typed,
    kvq_attend_strided: kvc_kvq_attend_strided,
    tiers_new_tc: kvc_tiers_new_tc,
    kvq_get_protections: kvc_kvq_get_protections,
    kvq_cells_new: kvc_kvq_cells_new,
    kvq_cells_main_cell_bytes: kvc_kvq_cells_main_cell_bytes,
    kvq_cells_bytes_held: kvc_kvq_cells_bytes_held,
    kvq_cells_begin_ubatch: kvc_kvq_cells_begin_ubatch,
    kvq_cells_write: kvc_kvq_cells_write,
    kvq_cells_scores: kvc_kvq_cells_scores,
    kvq_cells_accumulate: kvc_kvq_cells_accumulate,
    kvq_cells_release: kvc_kvq_cells_release,
    kvq_cells_clear: kvc_kvq_cells_clear,
    kvq_cells_copy: kvc_kvq_cells_copy,
    kvq_cells_free: kvc_kvq_cells_free,
    kvq_cells_save: kvc_kvq_cells_save,
    kvq_cells_load: kvc_kvq_cells_load,
    kvq_cells_get_rows: kvc_kvq_cells_get_rows,
    kvq_cells_set_rows: kvc_kvq_cells_set_rows,
    kvq_cells_set_positions: kvc_kvq_cells_set_positions,
    kvq_cells_drop_ubatch: kvc_kvq_cells_drop_ubatch,
    kvq_cells_capacity_bytes: kvc_kvq_cells_capacity_bytes,
    kvq_cells_set_rollback: kvc_kvq_cells_set_rollback,
    kvq_cells_truncate: kvc_kvq_cells_truncate,
    kvq_cells_can_truncate: kvc_kvq_cells_can_truncate,
    kvq_cells_scores_tokens: kvc_kvq_cells_scores_tokens,
    kvq_cells_accumulate_tokens: kvc_kvq_cells_accumulate_tokens,
    // --- kv-prefix files (ABI 0.20) ---
    tiers_export_prefix: kvc_tiers_export_prefix,
    tiers_import_prefix: kvc_tiers_import_prefix,
};

/// Whether a program built against ABI version `requested` can use this library.
pub fn abi_compatible(requested: u32) -> bool {
    requested >> 16 == KVC_ABI_VERSION_MAJOR && requested & 0xffff <= KVC_ABI_VERSION & 0xffff
}

/// The function table of this library, for a program built against ABI version
/// `abi_version` (pass `KVC_ABI_VERSION`).
///
/// Returns NULL when the library cannot serve that version: a different ABI major, or a
/// newer minor than the library has. Then `kvc_last_error_message` explains (the one
/// function besides status-returning ones that sets the last error).
///
/// Ownership: the table is static and immutable; never free it; it stays valid while
/// the library is loaded.
/// Threads: safe from any thread.
///
/// Typical use: `dlopen("libkvc.so.0")`, one `dlsym(lib, "kvc_get_api")`, call it with
/// `KVC_ABI_VERSION`, then call everything through the table.
#[no_mangle]
pub extern "C" fn kvc_get_api(abi_version: u32) -> *const KvcApi {
    value_boundary(std::ptr::null(), || {
        if abi_compatible(abi_version) {
            &API
        } else {
            set_last_error(
                "kvc_get_api",
                &format_args!(
                    "the program needs ABI {}.{} but this library provides {}.{} (same major \
                     and a minor at least as new are required)",
                    abi_version >> 16,
                    abi_version & 0xffff,
                    kvc_abi_version() >> 16,
                    kvc_abi_version() & 0xffff
                ),
            );
            std::ptr::null()
        }
    })
}
