"""engine.maths.specs.VARIANTS: each attention variant's record against what the code does with it.

Every record is checked against the thing it stands for: ``trainable`` against the net's own
parameters, the κ theory against numpy's eigenvalues of the features' Gram (and the spectrum's
and the scaling law's theory functions), the parameter's default and bounds against the parser,
the slow-down against the estimates, the label and example against the help, parser and sidebar.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import RTOL64_EIG_ATTENTION, RTOL64_SAME
from engine.experiments import options
from engine.experiments.configs.influence import InfluenceConfig, estimate_influence
from engine.experiments.configs.kernels import KernelConfig, estimate_kernels
from engine.experiments.configs.malleability import MalleabilityConfig, estimate_malleability
from engine.experiments.configs.sweep import SweepConfig, estimate_sweep
from engine.experiments.scaling import theory_exponent
from engine.experiments.spectrum import theory_formula, theory_kappa
from engine.maths import spectral
from engine.maths.models import ATTENTION_FNS, ATTENTION_MODULES, Net, attention_features
from engine.maths.specs import VARIANTS, Attention, AttentionVariant, parse_attention, variant
from engine.runtime import budget as B
from engine.runtime.errors import BadInput

RECORDS = list(VARIANTS.values())
IDS = [v.kind.value for v in RECORDS]


def _inputs(n: int = 12, d: int = 48, seed: int = 0) -> torch.Tensor:
    """Rows whose Gram is full rank and well conditioned (n ≪ d: κ(G) ≈ 10, so κ(G)⁵ stays far
    above float64's resolution), float64."""
    return torch.from_numpy(np.random.default_rng(seed).normal(size=(n, d)))


def test_one_record_per_variant_with_its_feature_map():
    assert list(VARIANTS) == list(Attention)
    assert all(k is v.kind and isinstance(v, AttentionVariant) for k, v in VARIANTS.items())
    assert set(ATTENTION_FNS) == set(Attention)
    assert {v.kind for v in RECORDS if v.trainable} == set(ATTENTION_MODULES)


@pytest.mark.parametrize("v", RECORDS, ids=IDS)
def test_the_names_round_trip_through_the_parser(v):
    example = parse_attention(v.example)
    assert example.kind is v.kind and str(example) == v.example and variant(v.example) is v
    assert variant(v.kind) is v and variant(example) is v and example.variant is v
    assert v.usage.partition(":")[0] == v.kind.value
    assert f"{v.usage} ({v.label})" in options.ATTENTION_HELP
    bare = parse_attention(v.kind.value.upper())  # the bare name takes the default parameter
    assert bare.param == v.default_param
    if v.param is None:
        assert v.default_param is None and ":" not in v.usage
        with pytest.raises(BadInput, match=f"{v.kind.value!r} takes no parameter"):
            parse_attention(f"{v.kind.value}:2")
        return
    lo, hi = v.bounds
    assert lo <= v.default_param <= hi
    for ok in (lo, hi):
        assert parse_attention(f"{v.kind.value}:{ok}").param == ok
    for bad in (lo / 2 if lo > 0 else lo - 1, hi * 2, float("nan")):
        with pytest.raises(BadInput) as info:
            parse_attention(f"{v.kind.value}:{bad}")
        assert "\n" not in str(info.value) and f"{v.kind.value}:{bad}" in str(info.value)
    if v.integer:
        with pytest.raises(BadInput, match="needs an integer"):
            parse_attention(f"{v.kind.value}:{lo + 0.5}")
        assert str(parse_attention(f"{v.kind.value}:{float(lo)}")) == f"{v.kind.value}:{int(lo)}"


@pytest.mark.parametrize("v", RECORDS, ids=IDS)
def test_trainable_iff_the_net_has_attention_parameters(v):
    X = _inputs().float()
    net = Net("attn", X, 16, 3, attention=v.example)
    attention_params = [name for name, _ in net.named_parameters() if not name.startswith("mlp.")]
    assert bool(attention_params) is v.trainable
    assert net.fixed_features is not v.trainable
    relu = Net("relu", X, 16, 3, attention=v.example)  # 2L-ReLU has no attention, trainable or not
    assert relu.fixed_features and [n for n, _ in relu.named_parameters()] == ["mlp.W"]
    if v.trainable:  # the features follow the attention parameters the optimiser moves
        before = net.features(X).detach().clone()
        with torch.no_grad():
            for p in net.attn.parameters():
                p.add_(0.1)
        assert not torch.allclose(net.features(X), before)


def _numpy_kappa(A: np.ndarray) -> float:
    """κ of A Aᵀ over its nonzero eigenvalues (numpy's eigvalsh). A rank-r Gram's zero eigenvalues
    are rounding, ~1e-16·λ₁; its smallest true one here is above 1e-4·λ₁ (κ(G)³ ≲ 1e3 per factor)."""
    lam = np.linalg.eigvalsh(A @ A.T)
    lam = lam[lam > 1e-10 * lam.max()]
    return float(lam.max() / lam.min())


@pytest.mark.parametrize("v", RECORDS, ids=IDS)
def test_the_kappa_theory_against_numpy_and_the_theory_functions(v):
    X = _inputs()
    Z = (X / X.norm(dim=1, keepdim=True)).numpy()
    lam = np.sort(np.linalg.eigvalsh(Z @ Z.T))[::-1]  # eigenvalues of G, descending
    att = parse_attention(v.example)
    spec = spectral.gram_spectrum(torch.from_numpy(Z), None)
    p = att.kappa_exponent
    if p is None:  # no closed form: neither theory claims one
        assert v.kappa_exponent is None
        assert theory_kappa(v.example, spec) is None and theory_formula(v.example) is None
        assert theory_exponent("attn", v.example) is None
        return
    base = lam[0] / lam[int(att.param) - 1] if v.kappa_top else lam[0] / lam[-1]
    measured = _numpy_kappa(attention_features(X, X, v.example).numpy())
    assert measured == pytest.approx(base ** p, rel=RTOL64_EIG_ATTENTION)
    assert theory_kappa(v.example, spec) == pytest.approx(base ** p, rel=RTOL64_EIG_ATTENTION)
    assert theory_formula(v.example).endswith(f"^{p}")
    # the scaling law's width bound squares κ(G)^p; κ dials G there, so a top-r theory has no exponent
    assert theory_exponent("attn", v.example) == (None if v.kappa_top else 2.0 * p)
    assert theory_exponent("relu", v.example) == 2.0


def test_the_truncated_theory_reads_the_top_r_eigenvalues():
    """Not a restatement of the record: r = 3 of 12 must differ from κ(G)³ on this draw."""
    X = _inputs()
    Z = (X / X.norm(dim=1, keepdim=True)).numpy()
    lam = np.sort(np.linalg.eigvalsh(Z @ Z.T))[::-1]
    measured = _numpy_kappa(attention_features(X, X, "truncated:3").numpy())
    assert measured == pytest.approx((lam[0] / lam[2]) ** 3, rel=RTOL64_EIG_ATTENTION)
    assert abs(measured / (lam[0] / lam[-1]) ** 3 - 1) > 0.5


SYN = dict(dataset="synthetic", n=200, n_test=50, synthetic_d=32)


@pytest.mark.parametrize("v", RECORDS, ids=IDS)
def test_the_estimates_apply_the_slowdown_to_mlp_attn_only(v):
    from engine.data import DataSpec

    data = DataSpec(**SYN)
    k = {a: estimate_kernels(KernelConfig(data=data, arch=a, attention=v.example)).seconds for a in ("relu", "attn")}
    assert k["attn"] == pytest.approx(v.slowdown * k["relu"], rel=RTOL64_SAME)
    i = {a: estimate_influence(InfluenceConfig(data=data, archs=(a,), attention=v.example)).seconds - B.FIXED_S
         for a in ("relu", "attn")}
    assert i["attn"] == pytest.approx(v.slowdown * i["relu"], rel=RTOL64_SAME)
    ridge = {"readings": ("ridge",)}  # the flow and retrain readings refuse trainable attention
    for make, fn, extra in ((SweepConfig, estimate_sweep, {}), (MalleabilityConfig, estimate_malleability, ridge)):
        s = {a: fn(make(data=data, archs=(a,), attention=v.example, **extra)).seconds for a in ("relu", "attn")}
        assert (s["attn"] > s["relu"]) if v.slowdown > 1 else s["attn"] == pytest.approx(s["relu"], rel=RTOL64_SAME)


def test_the_sidebar_offers_each_variant_once():
    pytest.importorskip("streamlit")
    from ui.common import ATTENTION_CHOICES

    assert [parse_attention(c).kind for c in ATTENTION_CHOICES] == list(Attention)
