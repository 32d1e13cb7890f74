"""engine.maths.specs.VARIANTS: each attention variant's record against what the code does with it.

Every record is checked against the thing it stands for: its feature map against its numpy
``reference`` (every variant, with κ theory or without), ``trainable`` against the net's own
parameters, the κ theory against numpy's eigenvalues of the features' Gram (and the spectrum's
and the scaling law's theory functions), the parameter's default and bounds against the parser,
its ``flops`` against the estimates' attention time, the slow-down against the estimates, the
label and example against the help, parser and sidebar. The tests iterate the records, so a new
variant is checked without an edit here; the last test makes a throw-away one to show it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import ATOL64_CHAIN, RTOL64_CHAIN, RTOL64_EIG_ATTENTION, RTOL64_SAME
from engine.experiments import options
from engine.experiments.configs.influence import InfluenceConfig, estimate_influence
from engine.experiments.configs.kernels import KernelConfig, estimate_kernels
from engine.experiments.configs.malleability import MalleabilityConfig, estimate_malleability
from engine.experiments.configs.sweep import SweepConfig, estimate_sweep
from engine.experiments.scaling import theory_exponent
from engine.experiments.spectrum import theory_formula, theory_kappa
from engine.maths import models, spectral
from engine.maths.models import ATTENTION_FNS, ATTENTION_MODULES, Net, attention_features, normalize_rows
from engine.maths.specs import (
    VARIANTS,
    Attention,
    AttentionVariant,
    parse_attention,
    register_variant,
    unregister_variant,
    variant,
)
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
    _check_names(v)
    assert f"{v.usage} ({v.label})" in options.ATTENTION_HELP


def _check_names(v: AttentionVariant) -> None:
    """The example comes back from ``str(parse_attention(example))`` unchanged, the bare name takes
    the default parameter, the bounds are the parser's."""
    example = parse_attention(v.example)
    assert example.kind is v.kind and str(example) == v.example and variant(v.example) is v
    assert variant(v.kind) is v and variant(example) is v and example.variant is v
    assert v.usage.partition(":")[0] == v.kind.value
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


def _weights(v: AttentionVariant, d: int) -> tuple[torch.nn.Module | None, dict | None]:
    """A trainable variant's module at seed 0 in float64 (what its parameter-free map uses) and its
    parameters as arrays by name; (None, None) for the others."""
    if not v.trainable:
        return None, None
    module = ATTENTION_MODULES[v.kind](d, 0, torch.float64)
    return module, {name: w.detach().numpy() for name, w in module.named_parameters()}


def _check_feature_map(v: AttentionVariant) -> None:
    """The map of the example and of the bare name, on the training rows and on other rows, against
    the record's numpy reference (float64, rows normalised as the nets do)."""
    X, Xt = _inputs(), _inputs(5, seed=1)
    module, weights = _weights(v, X.shape[1])
    Z, Zt = (normalize_rows(A).numpy() for A in (X, Xt))
    for text in (v.example, v.kind.value):
        spec = parse_attention(text)
        for rows, Zrows in ((X, Z), (Xt, Zt)):
            expected = v.reference(Zrows, Z, spec.param, weights)
            got = attention_features(rows, X, text)  # a trainable one at its seed-0 init
            np.testing.assert_allclose(got.numpy(), expected, rtol=RTOL64_CHAIN, atol=ATOL64_CHAIN, err_msg=text)
            if module is not None:  # and with the net's own module
                got = attention_features(rows, X, text, module=module).detach()
                np.testing.assert_allclose(got.numpy(), expected, rtol=RTOL64_CHAIN, atol=ATOL64_CHAIN)


@pytest.mark.parametrize("v", RECORDS, ids=IDS)
def test_the_feature_map_against_its_numpy_reference(v):
    _check_feature_map(v)


def _check_flops(v: AttentionVariant) -> None:
    """The estimates' attention time is the record's FLOP count at the float64 rate, and grows with n and d."""
    spec = parse_attention(v.example)
    seconds = {(n, d): B.attention_s(v.example, n, d) for n in (100, 1000) for d in (32, 784)}
    assert seconds[100, 784] == pytest.approx(v.flops(spec.param, 100, 784) / B.FLOPS64, rel=RTOL64_SAME)
    assert 0 < seconds[100, 32] < min(seconds[1000, 32], seconds[100, 784])


@pytest.mark.parametrize("v", RECORDS, ids=IDS)
def test_the_estimates_cost_the_map_by_its_record(v):
    _check_flops(v)


def test_a_map_with_n_by_n_scores_is_costed_by_n_squared():
    """softmax's scores are n × n: at n ≫ d its estimate outgrows linear's d × d Gram (it did not
    while the estimate compared names)."""
    n, d = 20_000, 32
    assert B.attention_s("softmax", n, d) > 10 * B.attention_s("linear", n, d)
    assert B.attention_s("qkv", n, d) > 10 * B.attention_s("linear", n, d)


@pytest.mark.parametrize("v", RECORDS, ids=IDS)
def test_trainable_iff_the_net_has_attention_parameters(v):
    _check_trainable(v)


def _check_trainable(v: AttentionVariant) -> None:
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
    _check_kappa(v)


def _check_kappa(v: AttentionVariant) -> None:
    X = _inputs()
    Z = (X / X.norm(dim=1, keepdim=True)).numpy()
    lam = np.sort(np.linalg.eigvalsh(Z @ Z.T))[::-1]  # eigenvalues of G, descending
    att = parse_attention(v.example)
    spec = spectral.gram_spectrum(torch.from_numpy(Z), None)
    p = att.kappa_exponent
    if p is None:  # no closed form: neither theory claims one (its map is checked on its own, above)
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
    _check_slowdown(v)


def _check_slowdown(v: AttentionVariant) -> None:
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


# ---------------------------------------------------------------- a new variant, by the README alone

def _new_member(enum_cls, name: str, value: str):
    """What adding ``NAME = "value"`` to the enum's body does, at runtime (an Enum has no API for it)."""
    member = str.__new__(enum_cls, value)
    member._name_, member._value_, member._sort_order_ = name, value, len(enum_cls._member_names_)
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[value] = member
    enum_cls._member_names_.append(name)
    return member


def _drop_member(enum_cls, member) -> None:
    del enum_cls._member_map_[member._name_], enum_cls._value2member_map_[member._value_]
    enum_cls._member_names_.remove(member._name_)


@pytest.fixture()
def halved(monkeypatch):
    """A throw-away variant made the README's way ("How to add an attention variant"), at runtime:
    its enum value, its record (label, example, parameter, FLOP count, numpy reference, no κ
    theory) and its feature map beside the others. All gone again after the test."""
    kind = _new_member(Attention, "HALVED", "halved")
    rec = register_variant(AttentionVariant(
        kind, "halved:S", "linear scaled by S", "halved:0.5", param="scale", default_param=0.5, bounds=(0.01, 1.0),
        flops=lambda p, n, d: 4 * n * d * d, reference=lambda Z, R, p, w: p * (Z @ (R.T @ R))))
    monkeypatch.setitem(models.ATTENTION_FNS, kind, lambda Z, Zref, p: p * ((Z @ Zref.T) @ Zref))
    yield rec
    unregister_variant(kind)
    _drop_member(Attention, kind)


def test_a_new_variant_is_checked_by_the_record_wide_tests(halved):
    """The checks every record gets reach a variant registered now: the parser, its map against its
    reference, the estimates' cost and slow-down, the net's parameters, the absent κ theory."""
    assert list(VARIANTS) == list(Attention) and VARIANTS[halved.kind] is halved
    for check in (_check_names, _check_feature_map, _check_flops, _check_slowdown, _check_trainable, _check_kappa):
        check(halved)
    assert KernelConfig(attention="halved:0.25").attention == "halved:0.25"  # the configs take it
