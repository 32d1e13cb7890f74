"""engine.reporting.plots: axis titles on every figure, block averages against a plain numpy loop."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from conftest import ATOL32, ATOL32_ONE_PASS, RTOL32, RTOL32_ONE_PASS
from engine.maths import metrics
from engine.reporting import plots, tables


def _block_means_loop(K: np.ndarray, b: int) -> np.ndarray:
    """The simplest reference: a double loop over blocks."""
    r, c = math.ceil(K.shape[0] / b), math.ceil(K.shape[1] / b)
    out = np.empty((r, c))
    for i in range(r):
        for j in range(c):
            out[i, j] = K[i * b:(i + 1) * b, j * b:(j + 1) * b].mean()
    return out


@pytest.mark.parametrize("shape,max_side", [((7, 7), 10), ((1000, 1000), 500), ((1001, 999), 500),
                                            ((1234, 1234), 500), ((50, 30), 7)])
def test_block_average_matches_loop(shape, max_side):
    K = np.random.default_rng(0).standard_normal(shape)
    small, b = plots.block_average(K, max_side)
    assert small.dtype == np.float32
    assert max(small.shape) <= max_side
    assert b == max(1, math.ceil(max(shape) / max_side))
    np.testing.assert_allclose(small, _block_means_loop(K, b), rtol=RTOL32_ONE_PASS, atol=ATOL32_ONE_PASS)


def test_heatmap_ships_at_most_500_cells_per_side():
    n = 1100
    rng = np.random.default_rng(1)
    A = rng.standard_normal((n, 40))
    K_m, K_inf = A @ A.T / 40, A @ A.T / 40 + 0.01
    fig = plots.kernel_heatmaps_fig(K_m, K_inf, 256, "relu")
    heatmaps = [t for t in fig.data if isinstance(t, go.Heatmap)]
    assert len(heatmaps) == 3
    for t in heatmaps:
        z = np.asarray(t.z)
        assert z.shape[0] <= plots.MAX_SIDE and z.shape[1] <= plots.MAX_SIDE
        assert z.dtype == np.float32
    small, b = plots.block_average(K_m)
    np.testing.assert_allclose(np.asarray(heatmaps[0].z), small)
    np.testing.assert_allclose(np.asarray(heatmaps[2].z), _block_means_loop(K_m - K_inf, b), rtol=RTOL32, atol=ATOL32)
    assert plots.kernel_diff_data(K_m, K_inf).shape == small.shape


def _rows():
    rows = [{"arch": a, "width": w, "seed": s, "kernel_dist_init": 1 / math.sqrt(w) + 0.01 * s,
             "kernel_dist_trained": 2 / math.sqrt(w), "function_dist": 10.0 + s + (w if a == "attn" else -w) / 1e3}
            for a in ("relu", "attn") for w in (16, 64, 256) for s in (0, 1, 2)]
    losses = [{"arch": a, "width": w, "seed": 0, "epoch": e, "loss": 1.0 / (1 + e)}
              for a in ("relu", "attn") for w in (16, 64) for e in range(4)]
    return pd.DataFrame(rows), pd.DataFrame(losses)


def _titled(fig: go.Figure) -> bool:
    return bool(fig.layout.xaxis.title.text) and bool(fig.layout.yaxis.title.text)


def test_every_chart_has_axis_titles():
    rows, losses = _rows()
    eig = np.geomspace(10, 1e-3, 30)
    growth = pd.DataFrame({"n": [10, 20, 30], "numerical_rank": [10, 20, 30], "kappa": [5.0, 10.0, 20.0],
                           "kappa_attention": [125.0, 1e3, 8e3], "kappa_attention_theory": [125.0, 1e3, 8e3]})
    mall_rows = pd.DataFrame([{"arch": a, "attack": k, "eps": e, "seed": s, "flip_rate": 0.1 + 0.01 * s,
                               "spearman": 0.9} for a in ("relu", "attn") for k in ("fgsm", "pgd")
                              for e in (0.05, 0.3) for s in (0, 1)])
    mall = tables.percent(metrics.summarize(mall_rows, ["arch", "attack", "eps"], ["flip_rate", "spearman"]),
                          ["flip_rate"])
    inter = pd.DataFrame([{"arch": a, "intervention": i, "test_acc": 0.8, "influence_change": 0.1}
                          for a in ("relu", "attn") for i in ("none", "curated")])
    agg = pd.DataFrame({"arch": ["relu"] * 5 + ["attn"] * 5, "train_index": list(range(5)) * 2,
                        "label": [0, 1] * 5, "influence": np.linspace(-1, 1, 10)})
    measured = plots.distance_data(rows, "function_dist")
    paper = pd.DataFrame({"arch": ["relu", "relu", "attn", "attn"], "width": [16, 256, 16, 256],
                          "value": [4.0, 3.0, 1.0, 2.0]})
    compare = pd.DataFrame({"attack": ["FGSM", "PGD"] * 2, "arch": ["relu", "relu", "attn", "attn"],
                            "paper": [4, 3, 30, 29], "measured": [5, 4, 20, 25]})
    figs = [
        plots.spectrum_fig(plots.spectrum_data(eig, eig ** 3), 1e-12),
        plots.width_needed_fig(plots.width_needed_data({"attn_v1": 27.0, "attn_v2": None, "relu_v1": 10.0})),
        plots.kappa_growth_fig(plots.kappa_growth_data(growth)),
        plots.distance_fig(plots.distance_data(rows, "kernel_dist_init"), "kernel_dist_init"),
        plots.distance_fig(measured, "function_dist"),
        plots.loss_fig(plots.loss_data(losses)),
        plots.paper_trend_fig(plots.paper_trend_data(measured, paper)),
        plots.influence_hist_fig(plots.influence_hist_data(agg)),
        plots.influence_bar_fig(np.array([0.1, -0.2]), ["#1", "#2"], "x"),
        plots.flip_bars_fig(mall, 0.3),
        plots.eps_sweep_fig(mall),
        plots.interventions_fig(inter),
        plots.influence_shift_fig(np.array([0.1, -0.2, 0.3]), np.array([-0.1, -0.1, 0.2]), 1),
        plots.compare_bars_fig(compare, "attack", "flip rate (%)"),
        plots.kernel_heatmaps_fig(np.eye(4), np.eye(4), 16, "attn"),
        plots.before_after_fig(np.zeros(16), np.full(16, 0.1), None),
    ]
    for fig in figs:
        assert isinstance(fig, go.Figure)
        assert _titled(fig), fig.layout.title.text
        assert all(t.hovertemplate or t.hoverinfo == "skip" or isinstance(t, go.Image) for t in fig.data)


def test_distance_data_spans_seeds():
    rows, _ = _rows()
    d = plots.distance_data(rows, "kernel_dist_init")
    r = d[(d["arch"] == "relu") & (d["width"] == 16)].iloc[0]
    assert r["seeds"] == 3
    assert r["min"] == pytest.approx(0.25) and r["max"] == pytest.approx(0.27)
    assert r["mean"] == pytest.approx(0.26)


def test_paper_trend_is_relative_to_smallest_width():
    rows, _ = _rows()
    paper = pd.DataFrame({"arch": ["relu", "relu"], "width": [16, 4096], "value": [45.1, 39.2]})
    data = plots.paper_trend_data(plots.distance_data(rows, "function_dist"), paper)
    p = data[data["source"] == "paper"]
    assert p["relative"].tolist() == pytest.approx([1.0, 39.2 / 45.1])


def test_influence_extremes():
    v = np.array([0.5, -1.0, 0.0, 2.0, -0.1, 0.2])
    top, bottom = plots.influence_extremes(v, 2)
    assert top.tolist() == [3, 0] and bottom.tolist() == [1, 4]
    top, bottom = plots.influence_extremes(np.array([1.0, 2.0]), 3)
    assert top.tolist() == [1, 0] and bottom.size == 0


def test_image_grid_handles_grey_rgb_and_flat():
    grey = plots.image_grid_fig(np.random.rand(3, 784), (1, 28, 28), ["a", "b", "c"])
    assert sum(isinstance(t, go.Heatmap) for t in grey.data) == 3
    rgb = plots.image_grid_fig(np.random.rand(2, 3 * 8 * 8), (3, 8, 8), ["a", "b"])
    assert sum(isinstance(t, go.Image) for t in rgb.data) == 2
    flat = plots.image_grid_fig(np.random.rand(2, 64), None, ["a", "b"])
    assert np.asarray(flat.data[0].z).shape == (8, 8)


def test_influence_grid_puts_positive_above_negative():
    values = np.array([0.3, -0.2, 0.1, 0.0, -0.5])
    data = plots.influence_grid_data(values, list("abcde"), 2, "relu")
    assert data["role"].tolist() == ["positive", "positive", "negative", "negative"]
    assert data["train_index"].tolist() == [0, 2, 4, 1]
    one_sided = plots.influence_grid_data(np.array([0.3, 0.2, 0.1]), list("abc"), 2, "attn")
    fig = plots.influence_grid_fig(np.random.rand(3, 16), None, one_sided)
    assert len(fig.data) == 2                       # the empty second row has no traces


def test_scaling_data_follows_the_fit_and_keeps_censored_points():
    import math

    import pandas as pd

    from engine.reporting import plots

    widths = pd.DataFrame({"arch": ["relu", "relu", "attn", "attn"], "attention": [None, None, "linear", "linear"],
                           "kappa": [2.0, 8.0, 2.0, 8.0], "width_needed": [100.0, 400.0, 300.0, None],
                           "censored": [False, False, False, True]})
    fit = pd.DataFrame({"arch": ["relu", "attn"], "attention": [None, "linear"], "points": [2, 1],
                        "exponent": [1.0, None], "intercept": [math.log(50.0), None], "theory_exponent": [2.0, 6.0]})
    data = plots.scaling_data(widths, fit)
    relu = data[data.arch == "relu"]
    assert list(relu.fitted_width) == pytest.approx([100.0, 400.0])
    assert data[data.arch == "attn"].fitted_width.isna().all() and data.censored.sum() == 1
    fig = plots.scaling_fig(data, max_width=1024)
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    assert any(t.name == "MLP-Attn (linear): above 1024" for t in fig.data)
    # each architecture's colour whatever the order of the rows (MLP-Attn first here), as on every other chart
    flipped = plots.scaling_fig(plots.scaling_data(widths.iloc[::-1], fit), max_width=1024)
    colours = {t.name.split(":")[0]: t.marker.color for t in flipped.data if t.mode == "markers"}
    assert colours == {"2L-ReLU": plots.ARCH_COLORS["relu"], "MLP-Attn (linear)": plots.ARCH_COLORS["attn"]}


def test_trajectory_data_averages_seeds():
    import pandas as pd

    from engine.reporting import plots

    traj = pd.DataFrame({"arch": ["relu"] * 4, "width": [16] * 4, "seed": [0, 1, 0, 1], "epoch": [0, 0, 5, 5],
                         "kernel_dist": [0.2, 0.4, 0.3, 0.5]})
    data = plots.trajectory_data(traj)
    assert list(data.kernel_dist) == pytest.approx([0.3, 0.4])
    fig = plots.trajectory_fig(data)
    assert fig.layout.yaxis.type == "log" and fig.layout.xaxis.title.text


def test_scaling_chart_has_a_tick_at_every_kappa_tried():
    kappas = [2.0, 4.0, 8.0, 16.0]
    widths = pd.DataFrame({"arch": ["relu"] * 4, "attention": [None] * 4, "kappa": kappas,
                           "width_needed": [16.0, 32.0, 64.0, 128.0], "censored": [False] * 4})
    fit = pd.DataFrame({"arch": ["relu"], "attention": [None], "points": [4], "exponent": [1.0],
                        "intercept": [math.log(8.0)], "theory_exponent": [2.0]})
    fig = plots.scaling_fig(plots.scaling_data(widths, fit), max_width=1024)
    assert list(fig.layout.xaxis.tickvals) == kappas
    assert list(fig.layout.xaxis.ticktext) == ["2", "4", "8", "16"]


def test_influence_histograms_share_one_scale_and_say_when_they_differ():
    rng = np.random.default_rng(0)
    data = pd.DataFrame({"arch": ["relu"] * 200 + ["attn"] * 200, "train_index": list(range(200)) * 2,
                         "label": [0] * 400,
                         "influence": np.r_[rng.standard_normal(200), 0.01 * rng.standard_normal(200)]})
    fig = plots.influence_hist_fig(data, attention="softmax:0.1")
    h = [t for t in fig.data if isinstance(t, go.Histogram)]
    assert len(h) == 2 and h[0].xbins.size == h[1].xbins.size and h[0].xbins.start == h[1].xbins.start
    assert fig.layout.barmode == "overlay" and "xaxis2" not in fig.to_dict()["layout"]  # one x-axis
    assert h[1].name.startswith("MLP-Attn (softmax:0.1): median |I| ")
    notes = [a.text for a in fig.layout.annotations]
    assert len(notes) == 1 and "MLP-Attn (softmax:0.1): influences about" in notes[0] and "× smaller" in notes[0]
    alike = data.assign(influence=np.r_[rng.standard_normal(200), rng.standard_normal(200)])
    assert not any("smaller" in a.text for a in plots.influence_hist_fig(alike).layout.annotations)


@pytest.mark.parametrize("attention,formula,theory", [("linear", "κ(G)^3", lambda k: k ** 3),
                                                      ("stacked:2", "κ(G)^5", lambda k: k ** 5),
                                                      ("softmax:0.1", None, lambda k: None)])
def test_kappa_growth_theory_line_follows_the_attention_variant(attention, formula, theory):
    kappa = np.array([5.0, 10.0, 20.0])
    growth = pd.DataFrame({"n": [10, 20, 30], "numerical_rank": [10, 20, 30], "kappa": kappa,
                           "kappa_attention": kappa ** 2, "attention": attention,
                           "kappa_attention_theory": [theory(k) for k in kappa],
                           "kappa_attention_formula": formula})
    data = plots.kappa_growth_data(growth)
    fig = plots.kappa_growth_fig(data)
    names = [t.name for t in fig.data]
    assert any(f"κ of attention features, {attention}" in n for n in names)
    if formula is None:  # no line drawn, and the legend says why
        (placeholder,) = [t for t in fig.data if t.name == f"no closed-form theory for {attention} attention"]
        assert list(placeholder.x) == [None]
    else:
        (line,) = [t for t in fig.data if "theory for" in t.name]
        assert line.name == f"{plots.pretty_formula(formula)} (theory for {attention} attention)"
        np.testing.assert_allclose(np.asarray(line.y, float), [theory(k) for k in kappa])


def test_width_bounds_say_they_are_the_linear_attention_bound_for_other_variants():
    thr = {"attn_v1": 27.0, "attn_v2": 28.0, "relu_v1": 10.0, "relu_v2": 11.0}
    assert not plots.width_needed_data(thr)["bound"].str.contains("linear-attention").any()
    other = plots.width_needed_data(thr, "stacked:2")
    assert other[other.key.str.startswith("attn")]["bound"].str.contains("linear-attention bound").all()
    fig = plots.width_needed_fig(other)
    assert fig.data[0].textposition == "inside"     # values inside the bars: nothing to overlap
    assert not fig.layout.yaxis.showticklabels        # names above the bars, not crowding the axis


def test_labels_name_the_attention_variant():
    rows, losses = _rows()
    rows["attention"] = np.where(rows["arch"] == "attn", "truncated:10", None)
    data = plots.distance_data(rows, "kernel_dist_init")
    assert set(data.loc[data.arch == "attn", "attention"]) == {"truncated:10"}
    names = {t.name for t in plots.distance_fig(data, "kernel_dist_init").data}
    assert "MLP-Attn (truncated:10)" in names and "2L-ReLU" in names
    assert any("MLP-Attn (stacked:2)" in t.name for t in plots.loss_fig(plots.loss_data(losses), "stacked:2").data)
    paper = pd.DataFrame({"arch": ["attn", "attn"], "width": [16, 256], "value": [1.0, 2.0]})
    trend = plots.paper_trend_fig(plots.paper_trend_data(plots.distance_data(rows, "function_dist"), paper))
    names = {t.name for t in trend.data}
    assert "MLP-Attn (truncated:10), measured here" in names and "MLP-Attn (linear), paper" in names
    assert plots.pretty_formula("(λ_1/λ_10)^3") == "(λ_1/λ_10)³"


# ---------------------------------------------------------------- slides (issue 24)

def test_flip_rate_labels_sit_above_their_error_bars():
    summary = pd.DataFrame([{"arch": a, "attack": k, "eps": 0.3, "n_seeds": 3, "flip_rate_pct_mean": m,
                             "flip_rate_pct_sd": sd}
                            for a, k, m, sd in (("relu", "fgsm", 4.0, 2.0), ("relu", "pgd", 5.0, 4.0),
                                                ("attn", "fgsm", 30.0, 6.0), ("attn", "pgd", 33.0, 7.0))])
    fig = plots.flip_bars_fig(summary, 0.3, eps_label=plots.eps_label("linf", "raw"))
    bars = [t for t in fig.data if t.type == "bar"]
    labels = [t for t in fig.data if t.type == "scatter"]
    assert len(bars) == len(labels) == 2 and fig.layout.scattermode == "group"
    for bar, label in zip(bars, labels, strict=True):
        assert bar.text is None and label.offsetgroup == bar.offsetgroup  # the label shares its bar's slot
        np.testing.assert_allclose(label.y, np.asarray(bar.y) + np.asarray(bar.error_y.array))  # on the cap
    assert fig.layout.yaxis.range[1] > 40.0  # room above the tallest cap for its label
    assert fig.layout.xaxis.title.text == "attack, at ℓ∞ radius ε = 0.3, pixel units"


def test_heatmaps_span_exactly_their_points_and_mark_class_boundaries():
    y = np.repeat([0, 1, 2], [5, 7, 8])
    K = np.eye(20)
    fig = plots.kernel_heatmaps_fig(K, K, 16, "relu", y=y)
    assert list(fig.layout.xaxis.range) == [-0.5, 19.5] and list(fig.layout.yaxis.range) == [19.5, -0.5]
    assert plots.class_boundaries(y) == [5, 12]
    lines = [(s.x0, s.xref) for s in fig.layout.shapes if s.x0 == s.x1]  # vertical boundary lines
    assert sorted({x for x, _ in lines}) == [4.5, 11.5] and {r for _, r in lines} == {"x", "x2", "x3"}


def test_the_largest_models_are_drawn_in_hidden_units_of_this_net():
    fig = plots.width_needed_fig(plots.width_needed_data({"attn_v1": 27.0, "relu_v1": 10.0}), d=784, n_out=10)
    (line,) = [s for s in fig.layout.shapes if s.type == "line"]
    assert line.x0 == pytest.approx(12 - math.log10(794))  # 1e12 parameters = m (d + c)
    assert any(t.name == "1e12 parameters (largest models)" for t in fig.data)
    assert not any("params" in (t.name or "") + a.text for t in fig.data for a in fig.layout.annotations)


@pytest.mark.parametrize("attention", ["linear", "softmax:0.1"])
def test_the_practical_band_is_drawn_above_the_bars_and_named_where_no_label_can_collide(attention):
    """The band and the dashed line over the bars (translucent: a bar shows through), their labels in
    the legend and not above the plot (where the first bound's name, the legend and the title are);
    each name in the gap between its bar and the one above, with room for Presentation's 16 px."""
    from engine.reporting import export
    from engine.reporting.plots.kernels import CHROME_PX

    data = plots.width_needed_data({"attn_v1": 31.2, "attn_v2": 24.5, "relu_v1": 9.1, "relu_v2": 8.0}, attention)
    fig = plots.width_needed_fig(data)
    band, line = sorted(fig.layout.shapes, key=lambda s: s.type != "rect")
    assert band.layer == "above" and line.layer == "above" and band.opacity < 0.5
    assert (band.x0, band.x1) == plots.style.PRACTICAL_LOG10
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert len(legend) == 2 and "practical" in legend[0] and "largest models" in legend[1]
    assert all(list(t.x) == [None] and t.hoverinfo == "skip" for t in fig.data[1:]) and not fig.layout.legend.itemclick
    names = fig.layout.annotations
    assert [a.yref for a in names] == ["y"] * len(data)  # no label above the plot
    bar, lines = fig.data[0].width, 2 if attention != "linear" else 1
    y0, y1 = fig.layout.yaxis.range  # bottom, top: the first bound is on top
    row_px = (fig.layout.height - CHROME_PX) / (y0 - y1)
    for i, a in enumerate(names):
        assert a.yanchor == "bottom" and i - bar / 2 - 0.1 <= a.y <= i - bar / 2  # just above its own bar
        own = a.text.count("<br>") + 1
        assert own == (2 if lines == 2 and data["key"][i].startswith("attn") else 1)  # a variant's note: line 2
        room = (a.y - (i - 1 + bar / 2 if i else y1)) * row_px  # up to the bar above, or the plot's top
        assert room >= own * export.TALK["annotations"] * 1.3 + 2, (i, room)


def test_accuracies_are_drawn_on_a_linear_axis():
    rows = pd.DataFrame([{"arch": "relu", "width": w, "seed": s, "train_acc": 0.5 + 0.1 * s} for w in (16, 64)
                         for s in range(3)])
    fig = plots.distance_fig(plots.distance_data(rows, "train_acc"), "train_acc")
    assert fig.layout.yaxis.type != "log" and list(fig.layout.yaxis.range) == [0, 1.02]


def test_small_multiples_of_the_regime_share_one_y_axis():
    summary = pd.DataFrame([{"arch": a, "width": w, "epoch": e, "lin_gap_mean": 0.1 * (3 if a == "attn" else 1),
                             "lin_gap_sd": 0.0} for a in ("relu", "attn") for w in (16, 64) for e in (0, 5)])
    fig = plots.regime_epoch_fig(plots.regime_epoch_data(summary, "lin_gap"), "lin_gap")
    assert fig.layout.yaxis2.matches == "y"


def test_the_null_charts_name_the_radius_as_the_flip_bars_do():
    """"attack, at ℓ2 radius ε = 0.3, units of the unit-norm rows", never "(… units = 0.3)"."""
    from engine.reporting.plots.nulls import excess_fig, nulls_fig

    summary = pd.DataFrame([{"arch": a, "attack": "pgd", "eps": 0.3, "n_seeds": 3, "flip_rate_mean": f,
                             "flip_rate_sd": 0.01, "null_seed_flip_rate_mean": 0.02, "null_random_flip_rate_mean": 0.01,
                             "flip_excess_mean": f - 0.02, "flip_excess_low": f - 0.05, "flip_excess_high": f}
                            for a, f in (("relu", 0.05), ("attn", 0.4))])
    label = plots.eps_label("l2", "normalized")
    assert excess_fig(summary, 0.3, label).layout.xaxis.title.text == f"attack, at {label.replace('ε', 'ε = 0.3')}"
    assert nulls_fig(summary, 0.3, label).layout.xaxis.title.text.endswith("ℓ2 radius ε = 0.3, units of the "
                                                                          "unit-norm rows")
    assert plots.style.eps_at("radius", 0.05) == "radius = 0.05"
    fig = nulls_fig(summary, 0.3, label)
    legend = [(t.name, t.marker.pattern.shape, t.marker.opacity) for t in fig.data]
    assert len({(shape, alpha) for _, shape, alpha in legend}) == 3  # attack, seed null, random null: told apart


def test_excess_against_width_draws_a_line_per_architecture_and_reading_with_its_interval():
    rows = [{"arch": a, "reading": r, "width": w, "attack": "pgd", "eps": 0.3, "flip_rate_mean": 0.3,
             "null_seed_flip_rate_mean": 0.05, "null_random_flip_rate_mean": 0.02, "flip_excess_mean": 0.25,
             "flip_excess_low": 0.1, "flip_excess_high": 0.4}
            for a in ("relu", "attn") for r in ("ridge", "retrain") for w in (64, 1024)]
    data = plots.excess_width_data(pd.DataFrame(rows), "pgd", 0.3)
    assert list(data["flip_excess"]) == [25.0] * 8 and list(data["larger_null"]) == [5.0] * 8
    fig = plots.excess_width_fig(data)
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert len(lines) == 4 and {t.line.dash for t in lines} == {"dot", "solid"}
    assert all(np.allclose(t.error_y.array, 15.0) and np.allclose(t.error_y.arrayminus, 15.0) for t in lines)


def test_each_malleability_chart_downloads_its_own_columns_only():
    """Not the whole fifty-column summary, the same for four charts: the row's names and the values drawn."""
    from engine.reporting.plots.nulls import bars_data, excess_data, excess_fig, nulls_data, nulls_fig, sweep_data

    summary = pd.DataFrame([{"arch": a, "width": 64, "attack": k, "eps": e, "reading": "ridge", "n_seeds": 2,
                             "flip_rate_mean": f, "flip_rate_sd": 0.01, "spearman_mean": 0.9, "spearman_sd": 0.02,
                             "null_seed_flip_rate_mean": 0.02, "null_seed_flip_rate_sd": 0.01, "null_random_flip_rate_mean":
                             0.01, "flip_excess_mean": f - 0.02, "flip_excess_low": f - 0.05, "flip_excess_high": f,
                             "test_acc_mean": 0.9, "rel_perturbation_mean": 0.1, "gap": 0.3, "ratio": 2.0}
                            for a, f in (("relu", 0.05), ("attn", 0.4)) for k in ("fgsm", "pgd") for e in (0.1, 0.3)])
    pct, keys = tables.percent(summary, ["flip_rate", "pair_flip_rate"]), ["arch", "attack", "reading", "width", "eps"]
    nulls = nulls_data(summary, 0.3)
    assert list(nulls) == keys + ["flip_rate_pct", "null_seed_flip_rate_pct", "null_random_flip_rate_pct"]
    assert len(nulls) == 4 and set(nulls["eps"]) == {0.3}  # the rows at the ε shown, nothing else
    for trace, col in zip(nulls_fig(summary, 0.3).data, list(nulls)[5:], strict=True):  # the bars are the table
        np.testing.assert_allclose(trace.y, nulls[col])
    excess = excess_data(summary, 0.3)
    assert list(excess) == keys + ["flip_excess_pct", "flip_excess_low_pct", "flip_excess_high_pct"]
    np.testing.assert_allclose(np.sort(np.concatenate([t.y for t in excess_fig(summary, 0.3).data])),
                               np.sort(excess["flip_excess_pct"]))
    assert list(bars_data(pct, 0.3)) == keys + ["flip_rate_pct_mean", "flip_rate_pct_sd", "n_seeds"]
    assert list(bars_data(pct, 0.3, "spearman")) == keys + ["spearman_mean", "spearman_sd", "n_seeds"]
    sweep = sweep_data(pct)
    assert list(sweep) == keys + ["flip_rate_pct_mean", "flip_rate_pct_sd"] and len(sweep) == len(pct)
    bars = [t for t in plots.flip_bars_fig(bars_data(pct, 0.3), 0.3).data if t.type == "bar"]  # draws from its table
    assert [list(t.y) for t in bars] == [list(t.y) for t in plots.flip_bars_fig(pct, 0.3).data if t.type == "bar"]
