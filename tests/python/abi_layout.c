/* Prints the size of every libkvedge struct the Python binding mirrors with ctypes
 * (clients/python/kvedge/_ffi.py) and the offset of each of its fields, one per line:
 * "S struct size" and "F struct field offset", and the constants it mirrors: "C name value"
 * (the headers' version and every error code). tests/python/test_abi.py compares them with
 * ctypes.sizeof / offsetof and the package's values, so a change on either side fails that
 * test. */
#include <stddef.h>
#include <stdio.h>

#include "clients/lib/kvedge.h"

typedef __typeof__(((kvedge_fetch_plan_t *)0)->layer[0]) s_plan_layer_t;

#define S(T, name)    printf("S %s %zu\n", name, sizeof(T))
#define F(T, name, f) printf("F %s %s %zu\n", name, #f, offsetof(T, f))

int main(void)
{
    printf("C KVEDGE_VERSION_NUMBER %d\n", KVEDGE_VERSION_NUMBER);
    printf("C KVEDGE_ERR_BASE %d\n", KVEDGE_ERR_BASE);
#define S_ERR(name, n, msg) printf("C KVEDGE_" #name " %d\n", (int)KVEDGE_##name);
    KVEDGE_ERRNO_MAP(S_ERR)
#undef S_ERR

    S(kvedge_chunk_id_t, "kvedge_chunk_id_t");
    F(kvedge_chunk_id_t, "kvedge_chunk_id_t", bytes);

    S(kvedge_model_t, "kvedge_model_t");
    F(kvedge_model_t, "kvedge_model_t", id);
    F(kvedge_model_t, "kvedge_model_t", layers);
    F(kvedge_model_t, "kvedge_model_t", kv_heads);
    F(kvedge_model_t, "kvedge_model_t", head_dim);
    F(kvedge_model_t, "kvedge_model_t", dtype);

#define T kvedge_chunk_info_t
    S(T, "kvedge_chunk_info_t");
    F(T, "kvedge_chunk_info_t", id);
    F(T, "kvedge_chunk_info_t", parent);
    F(T, "kvedge_chunk_info_t", has_parent);
    F(T, "kvedge_chunk_info_t", model_id);
    F(T, "kvedge_chunk_info_t", index);
    F(T, "kvedge_chunk_info_t", tokens);
    F(T, "kvedge_chunk_info_t", created_ms);
    F(T, "kvedge_chunk_info_t", tenant);
    F(T, "kvedge_chunk_info_t", name);
#undef T

#define T kvedge_client_opts_t
    S(T, "kvedge_client_opts_t");
    F(T, "kvedge_client_opts_t", size);
    F(T, "kvedge_client_opts_t", endpoint);
    F(T, "kvedge_client_opts_t", server_key);
    F(T, "kvedge_client_opts_t", client_cert);
    F(T, "kvedge_client_opts_t", deadline_ms);
    F(T, "kvedge_client_opts_t", credit);
    F(T, "kvedge_client_opts_t", name);
    F(T, "kvedge_client_opts_t", link);
    F(T, "kvedge_client_opts_t", window_bytes);
    F(T, "kvedge_client_opts_t", no_pack);
#undef T

#define T kvedge_node_info_t
    S(T, "kvedge_node_info_t");
    F(T, "kvedge_node_info_t", role);
    F(T, "kvedge_node_info_t", name);
    F(T, "kvedge_node_info_t", tenant_tag);
    F(T, "kvedge_node_info_t", max_items);
    F(T, "kvedge_node_info_t", max_chunks);
#undef T

#define T kvedge_put_item_t
    S(T, "kvedge_put_item_t");
    F(T, "kvedge_put_item_t", chunk);
    F(T, "kvedge_put_item_t", layer);
    F(T, "kvedge_put_item_t", head);
    F(T, "kvedge_put_item_t", block);
    F(T, "kvedge_put_item_t", len);
    F(T, "kvedge_put_item_t", pin);
    F(T, "kvedge_put_item_t", ttl_s);
#undef T

#define T kvedge_fetched_t
    S(T, "kvedge_fetched_t");
    F(T, "kvedge_fetched_t", status);
    F(T, "kvedge_fetched_t", offset);
    F(T, "kvedge_fetched_t", len);
#undef T

#define T kvedge_chunk_entry_t
    S(T, "kvedge_chunk_entry_t");
    F(T, "kvedge_chunk_entry_t", chunk);
    F(T, "kvedge_chunk_entry_t", blocks);
    F(T, "kvedge_chunk_entry_t", bytes);
    F(T, "kvedge_chunk_entry_t", pinned_blocks);
    F(T, "kvedge_chunk_entry_t", fp16_bytes);
#undef T

#define T kvedge_engine_stats_t
    S(T, "kvedge_engine_stats_t");
    F(T, "kvedge_engine_stats_t", blocks);
    F(T, "kvedge_engine_stats_t", bytes);
    F(T, "kvedge_engine_stats_t", fp16_bytes);
    F(T, "kvedge_engine_stats_t", pinned_blocks);
    F(T, "kvedge_engine_stats_t", pinned_bytes);
    F(T, "kvedge_engine_stats_t", capacity_bytes);
    F(T, "kvedge_engine_stats_t", quarantined);
    F(T, "kvedge_engine_stats_t", puts);
    F(T, "kvedge_engine_stats_t", gets);
    F(T, "kvedge_engine_stats_t", hits);
    F(T, "kvedge_engine_stats_t", misses);
    F(T, "kvedge_engine_stats_t", corrupt);
    F(T, "kvedge_engine_stats_t", evicted_blocks);
    F(T, "kvedge_engine_stats_t", evicted_bytes);
    F(T, "kvedge_engine_stats_t", expired);
    F(T, "kvedge_engine_stats_t", bytes_written);
    F(T, "kvedge_engine_stats_t", bytes_read);
#undef T

#define T kvedge_fetch_req_t
    S(T, "kvedge_fetch_req_t");
    F(T, "kvedge_fetch_req_t", size);
    F(T, "kvedge_fetch_req_t", model_id);
    F(T, "kvedge_fetch_req_t", chunks);
    F(T, "kvedge_fetch_req_t", n);
    F(T, "kvedge_fetch_req_t", first_layer);
    F(T, "kvedge_fetch_req_t", layers);
    F(T, "kvedge_fetch_req_t", tokens);
    F(T, "kvedge_fetch_req_t", compute_us);
    F(T, "kvedge_fetch_req_t", recompute_us);
    F(T, "kvedge_fetch_req_t", deadline_ms);
    F(T, "kvedge_fetch_req_t", mapped_model_id);
    F(T, "kvedge_fetch_req_t", mapped_chunks);
    F(T, "kvedge_fetch_req_t", accept);
    F(T, "kvedge_fetch_req_t", n_accept);
    F(T, "kvedge_fetch_req_t", quality_metric);
    F(T, "kvedge_fetch_req_t", quality_budget);
#undef T

#define T kvedge_fetch_source_t
    S(T, "kvedge_fetch_source_t");
    F(T, "kvedge_fetch_source_t", name);
    F(T, "kvedge_fetch_source_t", kind);
    F(T, "kvedge_fetch_source_t", up);
    F(T, "kvedge_fetch_source_t", rtt_us);
    F(T, "kvedge_fetch_source_t", bw_bytes_per_s);
#undef T

#define T s_plan_layer_t
    S(T, "kvedge_fetch_plan_t.layer");
    F(T, "kvedge_fetch_plan_t.layer", source);
    F(T, "kvedge_fetch_plan_t.layer", reason);
    F(T, "kvedge_fetch_plan_t.layer", cost_us);
    F(T, "kvedge_fetch_plan_t.layer", from_layer);
    F(T, "kvedge_fetch_plan_t.layer", prec);
    F(T, "kvedge_fetch_plan_t.layer", prec_reason);
#undef T

#define T kvedge_fetch_plan_t
    S(T, "kvedge_fetch_plan_t");
    F(T, "kvedge_fetch_plan_t", nsources);
    F(T, "kvedge_fetch_plan_t", source);
    F(T, "kvedge_fetch_plan_t", layers);
    F(T, "kvedge_fetch_plan_t", split);
    F(T, "kvedge_fetch_plan_t", total_us);
    F(T, "kvedge_fetch_plan_t", bound_us);
    F(T, "kvedge_fetch_plan_t", cloud_only_us);
    F(T, "kvedge_fetch_plan_t", recompute_all_us);
    F(T, "kvedge_fetch_plan_t", load_then_compute_us);
    F(T, "kvedge_fetch_plan_t", layer);
#undef T

#define T kvedge_fetch_layer_t
    S(T, "kvedge_fetch_layer_t");
    F(T, "kvedge_fetch_layer_t", layer);
    F(T, "kvedge_fetch_layer_t", source);
    F(T, "kvedge_fetch_layer_t", source_name);
    F(T, "kvedge_fetch_layer_t", reason);
    F(T, "kvedge_fetch_layer_t", status);
    F(T, "kvedge_fetch_layer_t", blocks);
    F(T, "kvedge_fetch_layer_t", attempts);
    F(T, "kvedge_fetch_layer_t", from_layer);
    F(T, "kvedge_fetch_layer_t", prec);
#undef T

#define T kvedge_fetch_cbs_t
    S(T, "kvedge_fetch_cbs_t");
    F(T, "kvedge_fetch_cbs_t", on_plan);
    F(T, "kvedge_fetch_cbs_t", on_block);
    F(T, "kvedge_fetch_cbs_t", on_layer);
    F(T, "kvedge_fetch_cbs_t", on_done);
#undef T

#define T kvedge_kv_dst_t
    S(T, "kvedge_kv_dst_t");
    F(T, "kvedge_kv_dst_t", layout);
    F(T, "kvedge_kv_dst_t", dtype);
    F(T, "kvedge_kv_dst_t", base);
    F(T, "kvedge_kv_dst_t", cap_bytes);
    F(T, "kvedge_kv_dst_t", heads);
    F(T, "kvedge_kv_dst_t", head_dim);
    F(T, "kvedge_kv_dst_t", tokens_cap);
    F(T, "kvedge_kv_dst_t", page_size);
    F(T, "kvedge_kv_dst_t", num_pages);
    F(T, "kvedge_kv_dst_t", page_table);
    F(T, "kvedge_kv_dst_t", table_len);
#undef T

#define T kvedge_pipeline_opts_t
    S(T, "kvedge_pipeline_opts_t");
    F(T, "kvedge_pipeline_opts_t", size);
    F(T, "kvedge_pipeline_opts_t", client);
    F(T, "kvedge_pipeline_opts_t", model);
    F(T, "kvedge_pipeline_opts_t", chunks);
    F(T, "kvedge_pipeline_opts_t", n_chunks);
    F(T, "kvedge_pipeline_opts_t", chunk_tokens);
    F(T, "kvedge_pipeline_opts_t", tokens);
    F(T, "kvedge_pipeline_opts_t", first_layer);
    F(T, "kvedge_pipeline_opts_t", layers);
    F(T, "kvedge_pipeline_opts_t", k);
    F(T, "kvedge_pipeline_opts_t", v);
    F(T, "kvedge_pipeline_opts_t", token_offset);
    F(T, "kvedge_pipeline_opts_t", on_device);
    F(T, "kvedge_pipeline_opts_t", ring_slots);
    F(T, "kvedge_pipeline_opts_t", slot_bytes);
    F(T, "kvedge_pipeline_opts_t", compute_us);
    F(T, "kvedge_pipeline_opts_t", recompute_us);
    F(T, "kvedge_pipeline_opts_t", deadline_ms);
    F(T, "kvedge_pipeline_opts_t", mapped_model);
    F(T, "kvedge_pipeline_opts_t", mapped_chunks);
    F(T, "kvedge_pipeline_opts_t", adapt);
    F(T, "kvedge_pipeline_opts_t", adapt_arg);
    F(T, "kvedge_pipeline_opts_t", accept);
    F(T, "kvedge_pipeline_opts_t", n_accept);
    F(T, "kvedge_pipeline_opts_t", quality_metric);
    F(T, "kvedge_pipeline_opts_t", quality_budget);
#undef T

#define T kvedge_pipeline_layer_stats_t
    S(T, "kvedge_pipeline_layer_stats_t");
    F(T, "kvedge_pipeline_layer_stats_t", layer);
    F(T, "kvedge_pipeline_layer_stats_t", done);
    F(T, "kvedge_pipeline_layer_stats_t", status);
    F(T, "kvedge_pipeline_layer_stats_t", order);
    F(T, "kvedge_pipeline_layer_stats_t", arrived_us);
    F(T, "kvedge_pipeline_layer_stats_t", resident_us);
    F(T, "kvedge_pipeline_layer_stats_t", wire_bytes);
    F(T, "kvedge_pipeline_layer_stats_t", raw_bytes);
    F(T, "kvedge_pipeline_layer_stats_t", blocks);
    F(T, "kvedge_pipeline_layer_stats_t", source);
    F(T, "kvedge_pipeline_layer_stats_t", kind);
    F(T, "kvedge_pipeline_layer_stats_t", reason);
    F(T, "kvedge_pipeline_layer_stats_t", from_layer);
    F(T, "kvedge_pipeline_layer_stats_t", adapt_failed);
#undef T

#define T kvedge_pipeline_stats_t
    S(T, "kvedge_pipeline_stats_t");
    F(T, "kvedge_pipeline_stats_t", device);
    F(T, "kvedge_pipeline_stats_t", via_proxy);
    F(T, "kvedge_pipeline_stats_t", ring_slots);
    F(T, "kvedge_pipeline_stats_t", slot_bytes);
    F(T, "kvedge_pipeline_stats_t", resident);
    F(T, "kvedge_pipeline_stats_t", misses);
    F(T, "kvedge_pipeline_stats_t", failed);
    F(T, "kvedge_pipeline_stats_t", wire_bytes);
    F(T, "kvedge_pipeline_stats_t", raw_bytes);
    F(T, "kvedge_pipeline_stats_t", sent_bytes);
    F(T, "kvedge_pipeline_stats_t", msg_bytes);
    F(T, "kvedge_pipeline_stats_t", ring_wait_us);
    F(T, "kvedge_pipeline_stats_t", copy_us);
    F(T, "kvedge_pipeline_stats_t", dequant_us);
    F(T, "kvedge_pipeline_stats_t", done_us);
    F(T, "kvedge_pipeline_stats_t", adapted);
    F(T, "kvedge_pipeline_stats_t", adapt_us);
    F(T, "kvedge_pipeline_stats_t", zero_copy_blocks);
    F(T, "kvedge_pipeline_stats_t", zero_copy_bytes);
#undef T

#define T kvedge_block_spec_t
    S(T, "kvedge_block_spec_t");
    F(T, "kvedge_block_spec_t", dtype);
    F(T, "kvedge_block_spec_t", scheme);
    F(T, "kvedge_block_spec_t", tokens);
    F(T, "kvedge_block_spec_t", head_dim);
    F(T, "kvedge_block_spec_t", group_size);
    F(T, "kvedge_block_spec_t", key_mask);
    F(T, "kvedge_block_spec_t", lz4);
#undef T

#define T kvedge_block_info_t
    S(T, "kvedge_block_info_t");
    F(T, "kvedge_block_info_t", version);
    F(T, "kvedge_block_info_t", dtype);
    F(T, "kvedge_block_info_t", scheme);
    F(T, "kvedge_block_info_t", tokens);
    F(T, "kvedge_block_info_t", head_dim);
    F(T, "kvedge_block_info_t", key_channels);
    F(T, "kvedge_block_info_t", group_size);
    F(T, "kvedge_block_info_t", lz4);
    F(T, "kvedge_block_info_t", ec);
    F(T, "kvedge_block_info_t", key_mask);
    F(T, "kvedge_block_info_t", raw_len);
    F(T, "kvedge_block_info_t", stored_len);
    F(T, "kvedge_block_info_t", body);
    F(T, "kvedge_block_info_t", checksum);
    F(T, "kvedge_block_info_t", total_len);
#undef T
    return 0;
}
