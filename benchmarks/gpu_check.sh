#!/usr/bin/env bash
# One prepared GPU check for a session that has the device tool (one H200):
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=560)
# It runs the CUDA tests, the count-path choice, the benchmarks at full size (neural-tangents peer
# skipped where jax has no CUDA), the paper grid and the full-MNIST-size kernel algebra
# (n = 60,000) on the GPU, writes JSON and logs under $OUT, and stops itself
# within about eight and a half minutes (each step has its own timeout).
# The device image has torch, numpy, scipy, pandas and pytest; diskcache travels as a
# wheel in .whl/ (see benchmarks/RESULTS.md for how to fetch it).
set -uo pipefail
OUT=${OUT:-artifacts/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ENGINE_CACHE_DIR=/tmp/engine-cache
if ! python3 -c "import diskcache" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 -c "import torch; print(torch.__version__)"; } \
  > "$OUT/machine.txt" 2>&1

# Which exact count GEMM the empirical NTK picks on the GPU (bf16, int8 or fp32, each timed) and on
# the host CPU, with the measured rates: engine.maths.counts.count_path_report.
timeout 40 python3 -c "
import json, torch
from engine.bench import machine_info
from engine.maths.counts import count_path_report
print(json.dumps({'machine': machine_info(torch.device('cuda')), 'cuda': count_path_report('cuda'),
                  'cpu': count_path_report('cpu')}))" > "$OUT/count_path.json" 2> "$OUT/count_path.log"
cat "$OUT/count_path.json"

timeout 140 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_ntk.py tests/test_memory.py tests/test_bench.py \
  2>&1 | tee "$OUT/cuda_tests.log" | tail -3

# The bench at full size; each part's row lands in bench_gpu.jsonl as it is measured, so a timeout
# keeps what came before it. The neural-tangents peer is skipped with its reason unless
# ENGINE_NT_PYTHON names a Python whose jax has CUDA (the device image has none).
timeout 100 python3 -c "
import json
from engine import bench
print(json.dumps(bench.run(quick=False, device='cuda', page=False, out='$OUT/bench_gpu.jsonl',
                           peer='neural-tangents', timeout=60)))" > "$OUT/bench_gpu.json" 2> "$OUT/bench_gpu.log"
cat "$OUT/bench_gpu.json" || tail -3 "$OUT/bench_gpu.jsonl"

timeout 110 python3 benchmarks/paper_grid.py --device cuda > "$OUT/paper_grid.json" 2> "$OUT/paper_grid.log"
tail -2 "$OUT/paper_grid.log"

# Full-MNIST size: n = 60,000 random l2-normalised rows, d = 784, width 4096, 1000 test points,
# 10 one-hot classes. Each step's wall time and peak GPU memory; a step that runs out of memory
# is recorded as such and the rest still run. Each n x n float64 kernel is 28.8 GB: K_m stays,
# K-infinity is dropped before the LOO step, which adds its Cholesky factor (one more n x n).
OUT="$OUT" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 150 python3 - <<'PY' 2>&1 | tee "$OUT/full_mnist_scale.log" | tail -12
import json, os, time
import torch
from engine.maths.influence import influence_matrix, loo_influence
from engine.maths.models import TwoLayerReLU, normalize_rows
from engine.maths.counts import count_path_report
from engine.maths.kinf import infinite_ntk
from engine.maths.ntk import empirical_ntk_features
from engine.maths.spectral import gram_spectrum

n, n_test, d, m, c, ridge = 60_000, 1000, 784, 4096, 10, 1e-3
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
phi_all = normalize_rows(torch.rand(n + n_test, d, generator=g, device=dev))  # float32
phi, phi_test = phi_all[:n], phi_all[n:]
y = torch.randint(0, c, (n,), generator=g, device=dev)
y_test = torch.randint(0, c, (n_test,), generator=g, device=dev)
Y = torch.nn.functional.one_hot(y, c).double()
head = TwoLayerReLU(d, m, 1, seed=0).to(dev)
out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "count_path": count_path_report(dev),
       "size": {"n": n, "n_test": n_test, "d": d, "m": m, "classes": c, "ridge": ridge}}
res = {}


def step(name, fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        res[name] = fn()
        torch.cuda.synchronize()
        out[name] = {"seconds": time.perf_counter() - t0}
    except Exception as exc:  # out of memory (torch's, or the engine's BadInput saying so) and the like
        out[name] = {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
    out[name]["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(name, out[name], flush=True)


step("warmup", lambda: empirical_ntk_features(head, phi[:256]).sum().item())  # CUDA context, cuBLAS
step("entk_train", lambda: empirical_ntk_features(head, phi))                # (n, n) float64
step("entk_test", lambda: empirical_ntk_features(head, phi_test, phi))       # (n_test, n)
step("kinf", lambda: infinite_ntk(phi))
if "kinf" in res:
    diag = res["kinf"].diagonal()
    out["kinf"]["diag_max_abs_err"] = float((diag - phi.double().square().sum(1) / 2).abs().max())
    res.pop("kinf")
    del diag
torch.cuda.empty_cache()
step("kinf_float32", lambda: infinite_ntk(phi, storage="float32"))  # half the memory of the float64 K
res.pop("kinf_float32", None)
torch.cuda.empty_cache()
step("spectrum", lambda: gram_spectrum(phi))  # n > d: the 784 x 784 Gram, n - d exact zeros
if "spectrum" in res:
    s = res.pop("spectrum")
    out["spectrum"].update({"rank": s.rank, "kappa": s.kappa})
if "entk_train" in res and "entk_test" in res:
    K, K_test = res.pop("entk_train"), res.pop("entk_test")
    step("loo_influence", lambda: loo_influence(K, K_test, Y, ridge))  # (n_test, n, c) float64, 4.8 GB
    if "loo_influence" in res:
        I = res.pop("loo_influence")
        out["loo_influence"]["finite"] = bool(torch.isfinite(I).all())
        del I
    torch.cuda.empty_cache()
    step("influence_true", lambda: influence_matrix(K, K_test, Y, ridge, target="true", y_test=y_test))
    res.clear()
    torch.cuda.empty_cache()
    step("entk_train_float32", lambda: empirical_ntk_features(head, phi, storage="float32"))
    if "entk_train_float32" in res:  # bit for bit the float64 kernel rounded once
        out["entk_train_float32"]["equals_float64_rounded"] = bool(torch.equal(res.pop("entk_train_float32"), K.float()))
with open(os.path.join(os.environ["OUT"], "full_mnist_scale.json"), "w") as f:
    json.dump(out, f, indent=1)
PY
