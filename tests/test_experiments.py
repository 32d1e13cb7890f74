import math

import numpy as np
import pytest

from conftest import ATOL64, RTOL32_INPUT, RTOL32_ONE_PASS, RTOL64_EIG, RTOL64_EIG_ATTENTION, RTOL64_SAME
from engine.data import DataSpec, load_sample
from engine.experiments.configs.kernels import KernelConfig
from engine.experiments.configs.spectrum import SpectrumConfig
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.kernels import run_kernels
from engine.experiments.spectrum import run_spectrum
from engine.experiments.sweep import run_ntk_sweep
from engine.maths.models import Net
from engine.maths.specs import TrainSpec
from engine.runtime.errors import BadInput, Cancelled
from reference import arccos_ntk

SYN = DataSpec("synthetic", n=60, n_test=20, synthetic_d=12, synthetic_kappa=30.0, synthetic_classes=3)


def test_sweep_rows_match_an_independent_numpy_computation():
    cfg = SweepConfig(data=SYN, widths=(32,), archs=("relu",), train=TrainSpec(epochs=0), ridge=1e-2)
    row = run_ntk_sweep(cfg).frames["rows"].iloc[0]
    s = load_sample(SYN)
    net = Net("relu", s.X.float(), 32, 3, seed=0)
    Z = (s.X / s.X.norm(dim=1, keepdim=True)).numpy()
    Zt = (s.X_test / s.X_test.norm(dim=1, keepdim=True)).numpy()
    W = net.mlp.W.detach().double().numpy()
    S = (Z @ W.T > 0).astype(float)
    K_m = (Z @ Z.T) * (S @ S.T) / 32
    K_inf = arccos_ntk(Z, Z)
    assert row.kernel_dist_init == pytest.approx(np.linalg.norm(K_m - K_inf) / np.linalg.norm(K_inf), rel=RTOL32_INPUT)
    assert row.kernel_dist_trained == row.kernel_dist_init and row.weight_movement == 0.0
    Y = np.eye(3)[s.y.numpy()]
    lam = 1e-2 * np.mean(np.diag(K_inf))
    f_ntk = arccos_ntk(Zt, Z) @ np.linalg.solve(K_inf + lam * np.eye(60), Y)
    f_m = np.maximum(Zt @ W.T, 0) @ net.mlp.a.double().numpy() / math.sqrt(32)
    assert row.function_dist == pytest.approx(np.linalg.norm(f_m - f_ntk), rel=RTOL32_ONE_PASS)
    assert row.test_acc == pytest.approx(np.mean(f_m.argmax(1) == s.y_test.numpy()))
    # the context of the numbers: scales compared, and the K∞ ridge baseline
    assert row.f_norm == pytest.approx(np.linalg.norm(f_m), rel=RTOL32_ONE_PASS)
    assert row.f_ntk_norm == pytest.approx(np.linalg.norm(f_ntk), rel=RTOL32_INPUT)  # float32 features
    assert row.function_dist_rel == pytest.approx(row.function_dist / row.f_ntk_norm, rel=RTOL64_SAME)
    assert row.test_acc_ntk == pytest.approx(np.mean(f_ntk.argmax(1) == s.y_test.numpy()))
    assert row.n_test == 20
    # κ-sensitive distances, from scipy/numpy directly
    import scipy.linalg
    R = scipy.linalg.sqrtm(np.linalg.inv(K_inf + lam * np.eye(60))).real
    assert row.kernel_dist_whitened_init == pytest.approx(np.linalg.norm(R @ (K_m - K_inf) @ R, 2), rel=RTOL32_ONE_PASS)
    K_mt = (Zt @ Z.T) * ((Zt @ W.T > 0).astype(float) @ S.T) / 32
    lam_m = 1e-2 * np.mean(np.diag(K_m))
    f_m_krr = K_mt @ np.linalg.solve(K_m + lam_m * np.eye(60), Y)
    assert row.prediction_gap_init == pytest.approx(np.linalg.norm(f_m_krr - f_ntk) / np.linalg.norm(f_ntk),
                                                    rel=RTOL32_ONE_PASS)


def test_sweep_summary_is_mean_and_sd_over_seeds():
    cfg = SweepConfig(data=SYN, widths=(16, 64), archs=("relu",), seeds=(0, 1, 2), train=TrainSpec(epochs=1))
    res = run_ntk_sweep(cfg)
    rows, summary = res.frames["rows"], res.frames["summary"]
    assert len(rows) == 6 and len(summary) == 2 and (summary.n_seeds == 3).all()
    for width in (16, 64):
        v = rows[rows.width == width].kernel_dist_init.to_numpy()
        got = summary[summary.width == width].iloc[0]
        assert got.kernel_dist_init_mean == pytest.approx(v.mean(), rel=RTOL64_SAME)
        assert got.kernel_dist_init_sd == pytest.approx(v.std(ddof=1), rel=RTOL64_SAME)


def test_training_moves_weights_and_records_losses(cache):
    cfg = SweepConfig(data=SYN, widths=(16, 64), archs=("relu", "attn"), seeds=(0, 1),
                      train=TrainSpec(epochs=3, batch_size=16))
    stages = []
    res = run_ntk_sweep(cfg, cache, progress=lambda f, s: stages.append((f, s)))
    rows, losses = res.frames["rows"], res.frames["losses"]
    assert len(rows) == 8 and (rows.weight_movement > 0).all()
    assert (rows.kernel_dist_trained != rows.kernel_dist_init).any()  # a few sign flips at most
    assert len(losses) == 8 * 4 and set(losses.epoch) == {0, 1, 2, 3}
    fracs = [f for f, _ in stages]
    assert fracs == sorted(fracs) and fracs[-1] == 1.0
    again = run_ntk_sweep(cfg, cache)
    assert again.cached
    np.testing.assert_allclose(again.frames["rows"].kernel_dist_trained, rows.kernel_dist_trained, rtol=RTOL64_SAME)


def test_relu_kernel_distance_falls_like_inverse_sqrt_width_on_mnist(mnist_dir):
    cfg = SweepConfig(data=DataSpec("mnist", n=200, n_test=50), widths=(16, 64, 256, 1024, 4096),
                      archs=("relu",), seeds=(0, 1, 2), train=TrainSpec(epochs=0))
    rows = run_ntk_sweep(cfg, data_dir=mnist_dir).frames["rows"]
    dist = rows.groupby("width").kernel_dist_init.mean()
    slope = np.polyfit(np.log(dist.index), np.log(dist.values), 1)[0]
    assert -0.65 < slope < -0.45, dist


def test_spectrum_summary_and_growth():
    cfg = SpectrumConfig(data=DataSpec("synthetic", n=40, n_test=1, synthetic_d=10, synthetic_kappa=50.0,
                                       normalize=False), growth_ns=(10, 20, 40))
    res = run_spectrum(cfg)
    s = res.meta["summary"]
    assert s["numerical_rank"] == 10 and s["kappa"] == pytest.approx(50.0, rel=RTOL64_EIG)
    assert s["kappa_attention"] == pytest.approx(50.0**3, rel=RTOL64_EIG_ATTENTION)
    assert s["kappa_attention_theory"] == pytest.approx(50.0**3, rel=RTOL64_EIG)
    assert s["kappa_d"] == pytest.approx(50.0, rel=RTOL64_EIG)
    assert list(res.frames["growth"].n) == [10, 20, 40]
    np.testing.assert_allclose(res.arrays["eig_attention"][:10], res.arrays["eig_G"][:10] ** 3, rtol=RTOL64_EIG)


@pytest.mark.parametrize("attention,power", [("stacked:2", 5), ("truncated:4", 3)])
def test_spectrum_theory_for_variants(attention, power):
    cfg = SpectrumConfig(data=DataSpec("synthetic", n=30, n_test=1, synthetic_d=8, synthetic_kappa=4.0,
                                       normalize=False), attention=attention)
    s = run_spectrum(cfg).meta["summary"]
    lam = run_spectrum(cfg).arrays["eig_G"]
    expected = (lam[0] / lam[3]) ** 3 if attention.startswith("trunc") else 4.0**power
    assert s["kappa_attention_theory"] == pytest.approx(expected, rel=RTOL64_EIG)
    assert s["kappa_attention"] == pytest.approx(expected, rel=RTOL64_EIG_ATTENTION)


def test_kernels_are_sorted_by_label_and_consistent():
    cfg = KernelConfig(data=SYN, arch="attn", width=64, train=TrainSpec(epochs=2))
    res = run_kernels(cfg)
    y = res.arrays["y"]
    assert (np.diff(y) >= 0).all()
    for k in ("K_init", "K_trained", "K_inf"):
        assert res.arrays[k].shape == (60, 60)
        np.testing.assert_allclose(res.arrays[k], res.arrays[k].T, atol=ATOL64)


@pytest.mark.parametrize("kwargs,match", [({"widths": (16, 0)}, "widths"), ({"archs": ("cnn",)}, "arch"),
                                          ({"widths": ()}, "widths"), ({"ridge": 0.0}, "ridge"),
                                          ({"attention": "cosine"}, "attention")])
def test_bad_sweep_configs(kwargs, match):
    with pytest.raises(BadInput, match=match):
        run_ntk_sweep(SweepConfig(data=SYN, **kwargs))


def test_cancel_flag_stops_a_sweep():
    class Flag:
        def is_set(self):
            return True

    with pytest.raises(Cancelled):
        run_ntk_sweep(SweepConfig(data=SYN, widths=(8,), train=TrainSpec(epochs=1)), cancel=Flag())


def test_kernel_trajectory_from_snapshots():
    cfg = SweepConfig(data=SYN, widths=(32,), archs=("relu",), seeds=(0,),
                      train=TrainSpec(epochs=4, snapshot_epochs=(0, 2, 4)))
    res = run_ntk_sweep(cfg)
    traj, row = res.frames["trajectory"], res.frames["rows"].iloc[0]
    assert list(traj.epoch) == [0, 2, 4]
    assert traj.kernel_dist.iloc[0] == pytest.approx(row.kernel_dist_init)
    assert traj.kernel_dist.iloc[-1] == pytest.approx(row.kernel_dist_trained)


@pytest.mark.parametrize("kappa,saturated", [(10.0, False), (1e6, True)])
def test_spectrum_flags_kappa_beyond_float64_resolution(kappa, saturated):
    data = DataSpec("synthetic", n=60, n_test=1, synthetic_d=40, synthetic_kappa=kappa, normalize=False)
    s = run_spectrum(SpectrumConfig(data=data)).meta["summary"]
    assert s["kappa_attention_saturated"] is saturated
    assert s["kappa_attention_formula"] == "κ(G)^3"
    if not saturated:  # resolvable: the measured κ of the attention Gram is the cube, to float64 accuracy
        assert s["kappa_attention"] == pytest.approx(s["kappa"] ** 3, rel=RTOL64_EIG_ATTENTION)
    else:             # saturated: the measured value is capped near 1/rtol, far below the theory
        assert s["kappa_attention"] <= s["kappa_resolvable"] * 1.01 < s["kappa_attention_theory"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the error a CPU-only machine gives")
def test_cuda_without_a_gpu_fails_the_same_with_a_cached_result(cache):
    cfg = SpectrumConfig(data=DataSpec("synthetic", n=20, n_test=1, synthetic_d=6))
    run_spectrum(cfg, cache, device="cpu")
    assert run_spectrum(cfg, cache, device="cpu").cached
    with pytest.raises(BadInput, match="no CUDA GPU"):
        run_spectrum(cfg, cache, device="cuda")


def _resume_cases():
    """(experiment, config, unit of a progress stage, the units kept when cancelled at the first
    attn unit, the units a resumed run computes): every experiment whose run resumes."""
    import re

    from engine.experiments.configs.dynamics import DynamicsConfig
    from engine.experiments.configs.influence import InfluenceConfig
    from engine.experiments.configs.malleability import MalleabilityConfig
    from engine.experiments.configs.retrain import RetrainConfig
    from engine.experiments.configs.scaling import ScalingConfig

    syn = DataSpec(dataset="synthetic", n=40, n_test=10, synthetic_d=16)
    sgd = TrainSpec(epochs=3, optimizer="sgd", lr=1.0, weight_decay=0.0)

    def seeds(stage):
        found = re.search(r"(relu|attn) seed \d", stage)
        return found and found.group(0)

    def models(stage):  # scaling's unit: a κ and a model, every width
        found = re.search(r"κ = [^,]+, (relu|attn(?: \w+)?)", stage)
        return found and found.group(1)

    def cells(stage):
        found = re.search(r"(relu|attn) m=\d+", stage)
        return found and found.group(0)

    by_seed = (['{"arch": "relu", "seed": 0}', '{"arch": "relu", "seed": 1}'], {"attn seed 0", "attn seed 1"})
    return [
        ("ntk-sweep", SweepConfig(data=syn, train=TrainSpec(epochs=3), widths=(16, 64), seeds=(0, 1)), seeds,
         *by_seed),
        ("dynamics", DynamicsConfig(data=syn, train=sgd, widths=(16, 64), seeds=(0, 1), record_every=1), seeds,
         *by_seed),
        ("influence", InfluenceConfig(data=syn, train=TrainSpec(epochs=3), width=16, seeds=(0, 1)), seeds, *by_seed),
        ("malleability", MalleabilityConfig(data=syn, train=TrainSpec(epochs=3), widths=(16,), seeds=(0, 1),
                                            attacks=("fgsm",), eps=(0.1,)), cells,
         ['{"arch": "relu", "draw": 0, "width": 16}'], {"attn m=16"}),
        ("retrain-loo", RetrainConfig(data=syn, train=TrainSpec(epochs=2, batch_size=20, optimizer="sgd", loss="mse",
                                                                 weight_decay=0.0), widths=(16, 32), seeds=(0, 1), k=2),
         seeds, *by_seed),
        ("scaling", ScalingConfig(n=16, d=8, kappas=(2.0,), min_width=16, max_width=32, per_octave=1, seeds=(0, 1),
                                  train=TrainSpec(epochs=2)), models,
         ['{"arch": "relu", "attention": null, "kappa": 2.0, "widths": [16, 32]}'], {"attn linear"}),
    ]


@pytest.mark.parametrize("name, cfg, unit_of, kept_units, rerun", _resume_cases(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_cancelled_run_resumes_from_its_finished_units_and_gives_the_same_result(tmp_path, name, cfg, unit_of,
                                                                                   kept_units, rerun):
    """Cancel keeps each finished unit (an architecture and seed; for scaling a κ and model,
    every width) in the cache; Run again computes only the rest, and its result is the one a run
    that never stopped gives (timings aside), arrays included."""
    import threading

    import pandas as pd

    from engine.experiments.registry import EXPERIMENTS
    from engine.runtime.cache import CHECKPOINT_PREFIX, Cache

    exp, cache, stop = EXPERIMENTS[name], Cache(tmp_path / "cache"), threading.Event()

    def cancel_at_attn(fraction, stage):
        if (unit_of(stage) or "").startswith("attn"):  # every 2L-ReLU unit is done by then
            stop.set()

    with pytest.raises(Cancelled):
        exp.run(cfg, cache=cache, progress=cancel_at_attn, cancel=stop)
    kept = sorted(str(k) for k in cache._store.iterkeys() if str(k).startswith(CHECKPOINT_PREFIX))
    prefix = min(kept, key=len) + ":"  # the run's list of units; each unit's key is that plus its name
    assert sorted(k[len(prefix):] for k in kept if k.startswith(prefix)) == kept_units

    stages = []
    resumed = exp.run(cfg, cache=cache, progress=lambda f, s: stages.append(s))
    assert {unit_of(s) for s in stages} - {None} == rerun  # 2L-ReLU was read back, not computed again
    assert not any(str(k).startswith(CHECKPOINT_PREFIX) for k in cache._store.iterkeys())  # stored: dropped
    assert resumed.meta["resumed_units"] == len(kept_units)  # so its time never feeds the speed factor

    fresh = exp.run(cfg, cache=None)
    for frame_name, frame in fresh.frames.items():
        pd.testing.assert_frame_equal(resumed.frames[frame_name].drop(columns=["seconds"], errors="ignore"),
                                      frame.drop(columns=["seconds"], errors="ignore"), check_exact=True)
    assert set(resumed.arrays) == set(fresh.arrays)
    for key, array in fresh.arrays.items():
        np.testing.assert_array_equal(resumed.arrays[key], array, strict=True)
