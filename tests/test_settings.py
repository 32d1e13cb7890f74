"""engine.runtime.settings: every config validates its own fields, and the CLI's flags are those fields.

Bad values are generated from each field's declared type, bounds and choices, for every config
of every experiment in the registry, so a new setting or a new experiment is covered without
editing this file. One test per (kind of violation); each checks every field it applies to.
"""

import dataclasses
import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import engine.cli as cli
from engine.data import DataSpec
from engine.experiments.configs.malleability import MalleabilityConfig
from engine.experiments.configs.scaling import ScalingConfig
from engine.experiments.configs.sweep import SweepConfig
from engine.experiments.registry import EXPERIMENTS, NESTED
from engine.maths.specs import AttackSpec
from engine.runtime.errors import BadInput
from engine.runtime.settings import meta, settings, validate

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = (*NESTED.values(), *(e.config for e in EXPERIMENTS.values()))
NAMES = tuple(EXPERIMENTS)


def _kind(cls, name):
    """(element type, is a tuple, may be None) from the field's annotation."""
    t = typing.get_type_hints(cls)[name]
    args = typing.get_args(t)
    optional = type(None) in args
    if optional:
        t = next(a for a in args if a is not type(None))
    if typing.get_origin(t) is tuple:
        return typing.get_args(t)[0], True, optional
    return t, False, optional


def _bad_values(cls):
    """(field, bad value, why) for every setting of cls, from its type, bounds and choices."""
    out = []
    for f, m in settings(cls):
        kind, is_tuple, optional = _kind(cls, f.name)
        wrap = (lambda v: (v,)) if is_tuple else (lambda v: v)
        if kind is float:
            out += [(f.name, wrap(math.nan), "nan"), (f.name, wrap(math.inf), "inf"),
                    (f.name, wrap(-math.inf), "-inf"), (f.name, wrap("0.5"), "text")]
        if kind is int:
            out += [(f.name, wrap(1.5), "fraction"), (f.name, wrap("3"), "text"), (f.name, wrap(True), "bool")]
        if kind is bool:
            out += [(f.name, 1, "int"), (f.name, "yes", "text")]
        if kind is str:
            out += [(f.name, wrap(3), "int")]
            if m.choices is not None or m.check is not None:
                # dataset may be a path to a .npz: an unknown name is refused when it is loaded
                out.append((f.name, wrap("" if f.name == "dataset" else "no-such-choice"), "choice"))
        if kind in (int, float):
            if m.lo is not None:
                out.append((f.name, wrap(kind(m.lo) if m.lo_open else kind(m.lo) - 1), "below"))
            if m.hi is not None:
                out.append((f.name, wrap(kind(m.hi) * 2 + 1), "above"))
        if is_tuple:
            out.append((f.name, f.default[0] if f.default else 1, "scalar"))
            if f.default:
                out.append((f.name, (), "empty"))
            if m.max_len is not None:
                out.append((f.name, (f.default[0] if f.default else 1,) * (m.max_len + 1), "too many"))
        if not optional:
            out.append((f.name, None, "none"))
    return out


CASES = [(cls, name, value, why) for cls in CONFIGS for name, value, why in _bad_values(cls)]
VIOLATIONS = sorted({why for *_, why in CASES})


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_defaults_validate(cls):
    cfg = cls()
    validate(cfg)
    for f, m in settings(cls):
        assert m.help and meta(cls, f.name) is m
        assert getattr(cfg, f.name) == f.default


@pytest.mark.parametrize("why", VIOLATIONS)
def test_bad_values_raise_one_line_naming_the_field(why):
    """Every field of every config that this kind of bad value applies to refuses it in one line."""
    wrong = []
    for cls, name, value, w in CASES:
        if w != why:
            continue
        try:
            cls(**{name: value})
        except BadInput as exc:
            message = str(exc)
            if name not in message or "\n" in message:
                wrong.append(f"{cls.__name__}.{name}: {message!r}")
        else:
            wrong.append(f"{cls.__name__}.{name}={value!r} was accepted")
    assert not wrong, wrong


def test_the_violations_cover_every_config():
    assert {cls for cls, *_ in CASES} == set(CONFIGS)


@pytest.mark.parametrize("cls,name", [(SweepConfig, "data"), (SweepConfig, "train"), (MalleabilityConfig, "attack"),
                                      (ScalingConfig, "train")])
def test_nested_configs_must_have_their_type(cls, name):
    with pytest.raises(BadInput, match=name):
        cls(**{name: "mnist"})


def test_lists_become_tuples_and_numpy_scalars_pass():
    import numpy as np

    cfg = SweepConfig(widths=[16, 32], seeds=[np.int64(0)], ridge=np.float32(0.01))
    assert cfg.widths == (16, 32) and isinstance(cfg.seeds, tuple)
    assert DataSpec(n=np.int64(20)).n == 20 and type(DataSpec(n=np.int64(20)).n) is int


# ---------------------------------------------------------------- presets

@pytest.mark.parametrize("name", NAMES)
def test_presets_are_instances_of_the_config(name):
    exp = EXPERIMENTS[name]
    assert {"default", "quick", "paper"} <= set(exp.presets)
    assert exp.presets["default"] == exp.config()
    for which, cfg in exp.presets.items():
        assert type(cfg) is exp.config, (name, which)
        assert dataclasses.replace(cfg) == cfg  # validates again


# ---------------------------------------------------------------- command line

@pytest.mark.parametrize("name", NAMES)
def test_cli_defaults_equal_the_dataclass_defaults(name):
    exp = EXPERIMENTS[name]
    ns = cli.build_parser().parse_args([name])
    assert cli.config_from_args(exp, ns) == exp.config()


@pytest.mark.parametrize("preset", ["quick", "paper"])
@pytest.mark.parametrize("name", NAMES)
def test_cli_presets_are_the_engine_presets(name, preset):
    exp = EXPERIMENTS[name]
    ns = cli.build_parser(preset).parse_args([name, "--preset", preset])
    assert cli.config_from_args(exp, ns) == exp.presets[preset]


FIGURES = [n for n, e in EXPERIMENTS.items() if e.figure] + [a for e in EXPERIMENTS.values() for a in e.aliases]


@pytest.mark.parametrize("args", [[], *[[n] for n in NAMES], ["grid"], ["bench"], ["datasets"], ["doctor"], ["figure"],
                                  *[["figure", k] for k in FIGURES]])
def test_every_help_prints(args, capsys):
    """argparse formats help text with %: a setting's help that says "0.7 %" must not break it."""
    with pytest.raises(SystemExit) as exc:
        cli.main([*args, "--help"])
    assert exc.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_every_cli_setting_is_a_flag(name):
    exp = EXPERIMENTS[name]
    ns = vars(cli.build_parser().parse_args([name]))
    for cls in [exp.config, *(NESTED[n] for n in exp.nested)]:
        for f, m in settings(cls):
            if m.cli:  # flags the command sets itself (attack method, ε, seed) come from its own sweeps
                assert f.name in ns, (cls.__name__, f.name)


def test_cli_flags_override_a_preset():
    exp = EXPERIMENTS["malleability"]
    ns = cli.build_parser("quick").parse_args(["malleability", "--preset", "quick", "--eps", "0.1,0.2", "--steps",
                                               "4", "--norm", "l2", "--space", "normalized", "--n", "50"])
    cfg = cli.config_from_args(exp, ns)
    quick = exp.presets["quick"]
    assert cfg.eps == (0.1, 0.2) and cfg.attack.steps == 4 and cfg.attack.norm == "l2" and cfg.space == "normalized"
    assert cfg.data.n == 50 and cfg.attacks == quick.attacks and cfg.train == quick.train
    assert cfg.attack.eps == AttackSpec().eps  # the sweep's ε is the config's, not the attack's


BAD_CLI = [
    ("ntk-sweep", "--lr", "inf"), ("ntk-sweep", "--init-std", "inf"), ("ntk-sweep", "--weight-decay", "inf"),
    ("ntk-sweep", "--optimizer", "sgd", "--lr", "1e30"), ("malleability", "--eps", "inf"),
    ("malleability", "--eps", "1e308"), ("spectrum", "--rank-rtol", "nan"), ("spectrum", "--eps", "nan"),
    ("spectrum", "--eps", "0"), ("ntk-sweep", "--widths", "1000000000"), ("ntk-sweep", "--attention", "stacked:999"),
    ("ntk-sweep", "--attention", "softmax:1e-300"),
]


SUBPROCESS = {BAD_CLI[0], BAD_CLI[4], BAD_CLI[6], BAD_CLI[11]}  # one per command, as a user runs it


@pytest.fixture(scope="module")
def bad_cli_results(tmp_path_factory):
    """Some bad invocations as real processes, started together (each pays torch's import);
    --estimate so that nothing could run long if a value slipped through."""
    cache = tmp_path_factory.mktemp("cli-cache")
    procs = {args: subprocess.Popen([sys.executable, "-m", "engine", *args, "--estimate", "--cache-dir", str(cache)],
                                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in BAD_CLI if args in SUBPROCESS}
    out = {}
    for args, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        out[args] = (p.returncode, stdout, stderr)
    return out


def _check_refused(rc, stdout, stderr):
    assert rc == 2, (stdout, stderr)
    assert stderr.startswith("error:") and stderr.strip().count("\n") == 0, stderr
    assert "Traceback" not in stderr and not stdout


@pytest.mark.parametrize("args", BAD_CLI, ids=[" ".join(a) for a in BAD_CLI])
def test_bad_cli_values_exit_2_with_one_line(args, capsys, tmp_path):
    rc = cli.main([*args, "--estimate", "--cache-dir", str(tmp_path)])  # the same entry, in this process
    out, err = capsys.readouterr()
    _check_refused(rc, out, err)


@pytest.mark.parametrize("args", sorted(SUBPROCESS), ids=[" ".join(a) for a in sorted(SUBPROCESS)])
def test_bad_cli_values_in_a_subprocess(bad_cli_results, args):
    _check_refused(*bad_cli_results[args])
