"""The ``alignment`` experiment: does a kernel put the labels in its top directions?

The power half of the paper's title: attention's data-dependent kernel "can reduce approximation
error by aligning with task structure". Per data draw, architecture, network seed and width: the
centred kernel–target alignment of K∞ and of K_m at init, along training and after training;
the cumulative power C(k) of the one-hot targets along each kernel's eigenvectors with its
spectrum; kernel-ridge learning curves measured beside the spectral theory's prediction
(``engine.maths.alignment``); and the verdict "MLP-Attn's kernel is better aligned" per width.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ..maths import alignment as AL
from ..maths.kinf import infinite_ntk
from ..maths.metrics import summarize
from ..maths.models import Net
from ..maths.ntk import empirical_ntk, empirical_ntk_at
from ..maths.ridge import kernel_regression, prediction_gap, relative_distance, whitened_distance
from ..maths.training import accuracy, n_outputs, predict_labels, resolve_loss, train_many
from ..runtime.cache import Result
from . import along
from .columns import ALIGNMENT_METRICS, AlignmentRow, KinfRow, SpectralReading, row_frame
from .configs.alignment import AlignmentConfig
from .runs import Prepared, Progress, check_finite, experiment_run, prepare, resumable, tick

if TYPE_CHECKING:
    from ..maths.heads import CancelFlag
    from .runs import DataDir

KERNELS = ("K∞", "K_m init", "K_m trained")  # the kernels whose C(k) and learning curves are kept


def _draws(cfg: AlignmentConfig) -> tuple[int, ...]:
    return cfg.data_seeds or (cfg.data.seed,)


def _ridge_acc(K: torch.Tensor, K_t: torch.Tensor, p: Prepared, ridge: float) -> float:
    f = kernel_regression(K, K_t, p.Y, ridge)
    return float((predict_labels(f) == p.yt).double().mean())


def kernel_reading(K: torch.Tensor, Y: np.ndarray, ridge: float) -> tuple[SpectralReading, tuple]:
    """Alignment, C(k) summaries and the eigendecomposition of one (n, n) kernel: (its reading,
    (K, eigenvalues, eigenvectors, C)). The one ``eigh`` serves C(k) and the theory."""
    Kn = K.double().cpu().numpy()
    s, V = AL.eigh_desc(Kn)
    C = AL.cumulative_power(s, V, Y)
    ps = AL.power_summary(C)
    return SpectralReading(align=AL.centered_alignment(Kn, Y), k90=ps["k_at"], auc=ps["auc_log"]), (Kn, s, V, C)


def _curves(kernel: str, parts: tuple, Y: np.ndarray, cfg: AlignmentConfig, seed: int) -> tuple[list, list]:
    """C(k) on a log grid with the spectrum, and the learning curve measured and predicted."""
    Kn, s, V, C = parts
    n = len(s)
    ks = AL.log_grid(n)
    power = [{"kernel": kernel, "k": int(k), "C": float(C[k - 1]), "eigenvalue": float(s[k - 1] / n)} for k in ks]
    ridge_abs = cfg.ridge * float(np.trace(Kn)) / n  # the relative ridge of every regression here
    lam, w = AL.population(s, V, Y)
    theory = AL.theory_curve(lam, w, cfg.curve_sizes, ridge_abs, held_out_of=n)
    mean, sd = AL.measured_curve(Kn, Y, cfg.curve_sizes, ridge_abs, cfg.curve_trials, seed)
    scale = float(np.mean(np.sum(Y ** 2, axis=1)))  # E_g of the zero predictor
    se = math.sqrt(cfg.curve_trials)
    curve = [{"kernel": kernel, "p": int(p), "p_over_n": p / n, "measured": m / scale, "measured_sd": v / scale,
              "measured_se": v / scale / se, "theory": t / scale}
             for p, m, v, t in zip(cfg.curve_sizes, mean, sd, theory, strict=True)]
    return power, curve


def _kinf_unit(cfg: AlignmentConfig, p: Prepared, arch: str, draw: int) -> dict:
    """K∞ of one architecture on one draw (it depends on neither seed nor width)."""
    net = Net(arch, p.X, cfg.widths[0], n_outputs(p.c), 0, cfg.init_std, cfg.attention, cfg.data.normalize,
              init=cfg.init).to(p.device)
    with torch.no_grad():
        phi, phi_t = net.features(p.X), net.features(p.Xt)
        K, K_t = infinite_ntk(phi), infinite_ntk(phi_t, phi)
    check_finite(K, f"the infinite-width kernel of {arch}")
    Y = p.Y.cpu().numpy()
    reading, parts = kernel_reading(K, Y, cfg.ridge)
    power, curve = _curves("K∞", parts, Y, cfg, draw)
    key = {"data_seed": draw, "arch": arch, "seed": None}
    row = KinfRow(data_seed=draw, arch=arch, align=reading.align, k90=reading.k90, auc=reading.auc,
                  test_acc_kernel=_ridge_acc(K, K_t, p, cfg.ridge))
    return {"row": asdict(row),
            "power": [{**key, **r} for r in power], "curves": [{**key, **r} for r in curve]}


def _group(cfg: AlignmentConfig, p: Prepared, arch: str, seed: int, draw: int,
           kinf: tuple[torch.Tensor, torch.Tensor], at: tuple[float, float], progress: Progress | None,
           cancel: CancelFlag | None) -> dict:
    """One draw, architecture and seed, every width: the unit a cancelled run resumes from. ``kinf``:
    K∞ on the training points and K∞(test, train)."""
    K_inf, K_inf_t = kinf
    lo, hi = at
    stage = f"draw {draw}, {arch} seed {seed}"
    tick(progress, cancel, lo, stage)
    Y = p.Y.cpu().numpy()
    nets = [Net(arch, p.X, w, n_outputs(p.c), seed, cfg.init_std, cfg.attention, cfg.data.normalize,
                init=cfg.init).to(p.device) for w in cfg.widths]
    init, keep = [], {}
    for w, net in zip(cfg.widths, nets, strict=True):
        K = empirical_ntk(net, p.X)
        check_finite(K, f"the empirical kernel of {arch} at width {w}")
        reading, parts = kernel_reading(K, Y, cfg.ridge)
        init.append((reading, _ridge_acc(K, empirical_ntk(net, p.Xt, p.X), p, cfg.ridge)))
        if w == max(cfg.widths):
            keep["K_m init"] = parts
    sub = None if progress is None else (lambda f, s: progress(lo + 0.6 * (hi - lo) * f, f"{stage}: training, {s}"))
    results = train_many(nets, p.X, p.y, p.c, cfg.train, seed, sub, cancel)
    tick(progress, cancel, lo + 0.6 * (hi - lo), f"{stage}: kernels after training")
    rows, training = [], []
    for w, net, (r0, acc0), tr in zip(cfg.widths, nets, init, results, strict=True):
        K = empirical_ntk(net, p.X)
        check_finite(K, f"the trained empirical kernel of {arch} at width {w}")
        reading, parts = kernel_reading(K, Y, cfg.ridge)
        if w == max(cfg.widths):
            keep["K_m trained"] = parts
        rows.append(asdict(AlignmentRow(
            data_seed=draw, arch=arch, attention=cfg.attention if arch == "attn" else None, width=w, seed=seed,
            align_init=r0.align, k90_init=r0.k90, auc_init=r0.auc, test_acc_kernel_init=acc0,
            align_trained=reading.align, k90_trained=reading.k90, auc_trained=reading.auc,
            test_acc_kernel_trained=_ridge_acc(K, empirical_ntk(net, p.Xt, p.X), p, cfg.ridge),
            test_acc=accuracy(net, p.Xt, p.yt), train_acc=accuracy(net, p.X, p.y),
            kernel_dist_trained=relative_distance(K, K_inf), final_loss=tr.losses[-1])))
        for e, W_e in sorted(tr.snapshots.items()):  # parameter-free attention: W is all that moves
            K_e, K_e_t = empirical_ntk_at(net, W_e, p.X), empirical_ntk_at(net, W_e, p.Xt, p.X)
            training.append({"data_seed": draw, "arch": arch, "width": w, "seed": seed, "epoch": e,
                             "alignment": AL.centered_alignment(K_e, Y),
                             "kernel_dist": relative_distance(K_e, K_inf),
                             "kernel_dist_whitened": whitened_distance(K_e, K_inf, cfg.ridge),
                             "prediction_gap": prediction_gap(K_e, K_e_t, K_inf, K_inf_t, p.Y, cfg.ridge)})
    snaps, design = [], []
    if cfg.flips:  # the vulnerability half at the same snapshots, largest width (engine.experiments.along)
        w, loss = max(cfg.widths), resolve_loss(cfg.train, p.c)
        tr = results[cfg.widths.index(w)]
        for i, (e, W_e) in enumerate(sorted(tr.snapshots.items())):
            tick(progress, cancel, lo + (0.65 + (0.05 if cfg.design else 0.15) * i / len(tr.snapshots)) * (hi - lo),
                 f"{stage}: attack at epoch {e}")
            snaps.append({"data_seed": draw, "arch": arch, "width": w, "seed": seed, "epoch": e,
                          **along.snapshot_flips(cfg, p, arch, w, seed, e, W_e, loss, cancel=cancel)})
        if cfg.design:  # the causal design: kernel K_m(0) / K_m(t) / K∞ × attacker epoch 0 / t
            tick(progress, cancel, lo + 0.7 * (hi - lo), f"{stage}: the causal design (kernel × attacker)")
            own = {s["epoch"]: {k: v for k, v in s.items() if k not in ("data_seed", "arch", "width", "seed", "epoch")}
                   for s in snaps}
            design = [{**c, "data_seed": draw} for c in
                      along.design_flips(cfg, p, arch, w, seed, tr.snapshots, tr.W0, own, loss, cancel=cancel)]
    tick(progress, cancel, lo + 0.8 * (hi - lo), f"{stage}: spectra and learning curves")
    key = {"data_seed": draw, "arch": arch, "seed": seed}
    power, curves = [], []
    for name, parts in keep.items():
        pw, cv = _curves(name, parts, Y, cfg, 1000 * draw + seed)
        power += [{**key, **r} for r in pw]
        curves += [{**key, **r} for r in cv] if name == "K_m trained" else []
    return {"rows": rows, "training": training, "power": power, "curves": curves, "snaps": snaps, "design": design}


@experiment_run("alignment")
def run_alignment(cfg: AlignmentConfig, data_dir: DataDir, dev: torch.device, progress: Progress | None,
                  cancel: CancelFlag | None) -> Result:
    """Kernel–target alignment of K∞ and K_m (init, along and after training), C(k) and learning curves.

    Frame ``rows``: one row per (data_seed, arch, width, seed): align_init / _trained (centred
    alignment with YYᵀ on the n training points), k90 (smallest k with C(k) ≥ 0.9) and auc (area
    under C against log k over log n) of K_m at init and trained, test_acc_kernel_init / _trained
    (ridge with K_m on the test points), the net's test_acc, train_acc, kernel_dist_trained
    (‖K_m − K∞‖_F / ‖K∞‖_F), final_loss. Frame ``summary``: mean, sd and count of each metric
    over (seed, draw) per (arch, attention, width). Frame ``kinf``: per (data_seed, arch) the same
    readings of K∞. Frame ``power``: C(k) and the eigenvalue s_k/n on a log grid of k, per kernel
    (K∞; K_m at init and trained at the largest width). Frame ``curves``: learning curves of K∞
    and the trained K_m (largest width): measured (mean, sd over trials) and theory, each as
    mean squared error over the zero predictor's. Frame ``training``: alignment and distance to K∞
    (Frobenius, whitened, and the ridge prediction gap) at ``cfg.train.snapshot_epochs``. Frame
    ``verdict``: ``engine.maths.alignment.verdict``.
    With ``cfg.flips``, frames ``flips_training`` (per draw, arch, seed and snapshot epoch of the largest
    width: the flip rate of the ridge reading on K_m(t) under a PGD attack on that epoch's net, its seed
    and random nulls, the excess with its interval, beside the alignment at that epoch) and
    ``flips_training_summary`` (per arch, width and epoch, the pooled excess): ``engine.experiments.along``;
    ``association``: Spearman ρ between the kernel's distance from K∞ (each of ``along.DISTANCES``) and the
    flip excess across nets and snapshots, per arch, with its interval (``along.association``). With ``cfg.design`` too, the causal
    design at every snapshot: ``flips_design`` (per net, epoch, kernel K_m(0) / K_m(t) / K∞ and attacker
    epoch 0 / t), ``flips_design_summary`` (pooled per cell) and ``design_effects`` (``along.DESIGN_RULE``
    per arch). Frame ``power_metrics``: the power half by every metric (``engine.maths.alignment.power_metrics``).
    """
    draws = _draws(cfg)
    meta: dict[str, Any]
    rows, kinf, training, power, curves, snaps, design, meta = [], [], [], [], [], [], [], {}
    units = len(draws) * len(cfg.archs) * (1 + len(cfg.seeds))
    done = 0
    for draw in draws:
        p = prepare(replace(cfg.data, seed=draw), data_dir, dev, None, cancel)
        meta = meta or {"n": p.sample.n, "n_test": int(p.Xt.shape[0]), "d": p.sample.d, "n_classes": p.c,
                        "source": p.sample.source, "device": str(dev)}
        for arch in cfg.archs:
            tick(progress, cancel, done / units, f"draw {draw}, {arch}: K∞")
            part = resumable(f"draw {draw} {arch} K∞", partial(_kinf_unit, cfg, p, arch, draw))
            kinf.append(part["row"])
            power += part["power"]
            curves += part["curves"]
            done += 1
            with torch.no_grad():  # K∞ again for the distances: cheaper than checkpointing an n×n kernel
                net = Net(arch, p.X, cfg.widths[0], n_outputs(p.c), 0, cfg.init_std, cfg.attention,
                          cfg.data.normalize, init=cfg.init).to(dev)
                phi = net.features(p.X)
                K_inf, K_inf_t = infinite_ntk(phi), infinite_ntk(net.features(p.Xt), phi)
            for seed in cfg.seeds:
                at = (done / units, (done + 1) / units)
                part = resumable(f"draw {draw} {arch} seed {seed}",
                                 partial(_group, cfg, p, arch, seed, draw, (K_inf, K_inf_t), at, progress, cancel))
                rows += part["rows"]
                training += part["training"]
                power += part["power"]
                curves += part["curves"]
                snaps += part.get("snaps", [])
                design += part.get("design", [])
                done += 1
    tick(progress, cancel, 1.0, "done")
    flips, flips_summary = along.frames(along.seed_nulls(snaps, cfg.seeds), pd.DataFrame(training))
    design_rows, design_summary = along.design_frames(design, cfg.seeds)
    frame = row_frame(AlignmentRow, rows)
    summary = summarize(frame, ["arch", "attention", "width"], ALIGNMENT_METRICS)
    meta["data_seeds"] = list(draws)
    frames = {"rows": frame, "summary": summary, "kinf": row_frame(KinfRow, kinf), "power": pd.DataFrame(power),
              "curves": pd.DataFrame(curves), "training": pd.DataFrame(training),
              "verdict": AL.verdict(frame), "flips_training": flips, "flips_training_summary": flips_summary,
              "flips_design": design_rows, "flips_design_summary": design_summary,
              "design_effects": along.design_effects(design_rows), "association": along.association(flips),
              "power_metrics": AL.power_metrics(frame, pd.DataFrame(curves))}
    return Result("alignment", {}, frames, {}, meta)
