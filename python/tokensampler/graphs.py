"""CUDA-graph variant names. A backend captures one graph per variant it reports and, at
replay, names the variant the step's route needs (chosen on the host in prepare_step)."""

CUDA_GRAPH_VARIANT_DEFAULT = "default"  # the generic route: any mix of filters per row
CUDA_GRAPH_VARIANT_NO_FILTER = "no_filter"
CUDA_GRAPH_VARIANT_TOP_K = "top_k"
CUDA_GRAPH_VARIANT_TOP_P = "top_p"
CUDA_GRAPH_VARIANT_TOP_K_TOP_P = "top_k_top_p"
CUDA_GRAPH_VARIANT_VERIFY_NO_FILTER = "verify_no_filter"
CUDA_GRAPH_VARIANT_MIN_P = "min_p"
CUDA_GRAPH_VARIANT_TOP_K_TOP_P_MIN_P = "top_k_top_p_min_p"
