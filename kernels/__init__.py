"""Kernels behind the engine's one ops seam (``kernels.dispatch.get_ops``).

Each ``kernels/<op>.py`` holds the Triton kernel ``_<op>_kernel``, its host
launcher ``<op>`` (checks shapes, strides, dtypes and devices) and the PyTorch
reference ``<op>_ref`` with the same signature. The references are also the
CPU production path, so they are vectorised: a Python loop runs over
sequences (prefill) or length groups (decode) only, never over tokens.

    kv_store.py                store_kv (slot mapping; negative slots skipped)
    paged_decode_attention.py  decode attention, GQA-shared K/V loads, split-KV + LSE merge
    prefill_attention.py       prefill/extend attention over the paged cache, causal offset mask
    rms_norm.py                rms_norm, fused_add_rms_norm
    rotary.py                  rotary_embedding (neox), build_cos_sin_cache
    activation.py              silu_and_mul
"""
