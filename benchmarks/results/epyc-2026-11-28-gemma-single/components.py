import sys, time, json, torch, os
sys.path.insert(0, "/work/main")
torch.set_num_threads(1)
import torch.nn.functional as F
from kernels import fused_ops_cpu as fused
from kernels.q8_matmul_cpu import q8_matmul_cpu
def t(fn, n=400):
    fn(); s=[]
    for _ in range(n):
        a=time.perf_counter(); fn(); s.append(time.perf_counter()-a)
    s.sort(); return round(s[0]*1e6,1)
res = {}
x = torch.randn(1, 4096).bfloat16()
for rep in range(2):
    res.setdefault("gelu_mul_torch_us", []).append(t(lambda: (lambda a, b: F.gelu(a, approximate="tanh") * b)(*x.chunk(2, -1))))
    res.setdefault("gelu_mul_native_us", []).append(t(lambda: fused.gelu_tanh_and_mul_cpu(x)))
codes = torch.randint(-32, 32, (640, 2048), dtype=torch.int8); sc16 = torch.rand(640, 128); xd = torch.randn(1, 2048).bfloat16()
dense = torch.randn(640, 2048).bfloat16()
codes32 = torch.randint(-16, 16, (4096, 640), dtype=torch.int8); sc32 = torch.rand(4096, 20); xg = torch.randn(1, 640).bfloat16()
for rep in range(2):
    res.setdefault("down_q6k_int8_bf16out_us", []).append(t(lambda: q8_matmul_cpu(xd, codes, sc16, torch.bfloat16)))
    res.setdefault("down_dense_bf16_linear_us", []).append(t(lambda: F.linear(xd, dense)))
    res.setdefault("gate_up_int8_f32out_then_to_us", []).append(t(lambda: q8_matmul_cpu(xg, codes32, sc32).to(torch.bfloat16)))
    res.setdefault("gate_up_int8_bf16out_us", []).append(t(lambda: q8_matmul_cpu(xg, codes32, sc32, torch.bfloat16)))
res["load_avg_1m"] = round(os.getloadavg()[0], 2)
print(json.dumps(res))
