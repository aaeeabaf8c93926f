"""Kernels behind the engine's one ops seam (``kernels.dispatch.get_ops``).

Each ``kernels/<op>.py`` holds the Triton kernel ``_<op>_kernel``, its host
launcher ``<op>`` (checks shapes, strides, dtypes and devices) and the PyTorch
reference ``<op>_ref`` with the same signature. The references are also the
CPU path where nothing faster exists, so they are vectorised: a Python loop
runs over sequences (prefill) or length groups (decode) only, never over
tokens. On CPUs the default backend ('cpu') swaps in native C kernels
(``csrc/``, compiled at first use by cpu_native.py) for decode attention and
the small fused ops; without a C compiler it is the references.

    kv_store.py                store_kv (slot mapping; negative slots skipped)
    paged_decode_attention.py  decode attention, GQA-shared K/V loads, split-KV + LSE merge
    prefill_attention.py       prefill/extend attention over the paged cache, causal offset mask
    rms_norm.py                rms_norm, fused_add_rms_norm
    rotary.py                  rotary_embedding (neox), build_cos_sin_cache
    activation.py              silu_and_mul; gelu_tanh_and_mul_ref (Gemma)
    paged_decode_attention_cpu.py  native C decode attention for CPUs (csrc/paged_decode_attention.c)
    fused_ops_cpu.py           native C rms_norm, fused_add_rms_norm, rotary, silu_and_mul, gelu_tanh_and_mul,
                               store_kv (csrc/fused_ops.c)
    q8_matmul_cpu.py           native C matmul by int8 blocks of 32 or 16 (csrc/q8_matmul.c)
"""
