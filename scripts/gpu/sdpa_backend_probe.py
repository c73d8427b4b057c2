"""Why decoding and training were slow on an H100 (2026-11-23): a decode step of
the `small` model (8 layers, width 512, GQA 8/2, bf16 compute over float32 weights) with a KV cache
that grows by one key per step, timed and profiled in PyTorch. With torch 2.11.0 the cuDNN SDPA
backend is picked and builds a cuDNN graph for every new key length (about 12 ms of CPU per call,
`aten::_cudnn_attention_forward` in the profile): 65 ms per step. `cudarl-train` turns that backend
off (`set_cudnn_attention`). Run on a GPU host: `python3 scripts/gpu/sdpa_backend_probe.py`
(pass `--no-cudnn` to see the step without it).
"""

import sys
import time

import torch
import torch.nn.functional as F

dev = "cuda"
bf = torch.bfloat16
if "--no-cudnn" in sys.argv:
    torch.backends.cuda.enable_cudnn_sdp(False)
torch.manual_seed(0)
nl = 8
b = 32
L = 1500
W = [
    [
        (torch.randn(o, i, device=dev) * 0.02).requires_grad_()
        for (o, i) in ((512, 512), (128, 512), (128, 512), (512, 512), (1408, 512), (1408, 512), (512, 1408))
    ]
    for _ in range(nl)
]
emb = (torch.randn(8192, 512, device=dev) * 0.02).requires_grad_()
nw = torch.ones(512, device=dev).requires_grad_()


def rms(x, w):
    xf = x.float()
    return w.to(bf) * (xf * (xf.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()).to(bf)


def rot(x):
    d = x.shape[-1]
    return torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)


def fwd(tok, cache, mixed=True):
    b, t = tok.shape
    past = cache[0][0].shape[2] if cache else 0
    x = F.embedding(tok, emb).to(bf)
    pos = torch.arange(past, past + t, device=dev).unsqueeze(0).expand(b, t)
    fr = pos.float().unsqueeze(-1) * torch.ones(1, 1, 32, device=dev)
    e = torch.cat([fr, fr], -1)
    cos = e.cos().to(bf).unsqueeze(1)
    sin = e.sin().to(bf).unsqueeze(1)
    for li in range(nl):
        wq, wk, wv, wo, wg, wu, wd = [w.to(bf) for w in W[li]]
        h = rms(x, nw)
        q = F.linear(h, wq).view(b, t, 8, 64).transpose(1, 2)
        k = F.linear(h, wk).view(b, t, 2, 64).transpose(1, 2)
        v = F.linear(h, wv).view(b, t, 2, 64).transpose(1, 2)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        if len(cache) > li:
            k = torch.cat([cache[li][0], k], 2)
            v = torch.cat([cache[li][1], v], 2)
            cache[li] = (k, v)
        else:
            cache.append((k, v))
        a = (
            F.scaled_dot_product_attention(q, k, v, is_causal=(past == 0), enable_gqa=True)
            .transpose(1, 2)
            .contiguous()
            .view(b, t, 512)
        )
        x = x + F.linear(a, wo)
        h = rms(x, nw)
        x = x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)
    return (rms(x, nw) @ emb.to(bf).t()).float()


with torch.no_grad():
    cache = []
    fwd(torch.randint(0, 8000, (b, L), device=dev), cache)
    tok = torch.zeros(b, 1, dtype=torch.long, device=dev)
    for _ in range(5):
        fwd(tok, cache)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(30):
        fwd(tok, cache)
    torch.cuda.synchronize()
    print("python mixed step with cache ms", (time.perf_counter() - t) / 30 * 1e3)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fwd(tok, cache)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15))
