"""engine.doctor.report: what torch sees and two kernel timings, as one JSON-able dict."""

import json
import math

import pytest
import torch

from engine.doctor import CUDA_DRIVER, describe, report
from engine.runtime.errors import BadInput
from engine.runtime.speed import SPEED_GEMM_FLOPS
from tests.conftest import requires_cuda

SMALL = dict(n=24, d=8, width=32, gemm=64, repeats=1)


@pytest.fixture(scope="module")
def cpu():
    return report("cpu", **SMALL)


def test_names_torch_and_the_device_it_computes_on(cpu):
    assert cpu["torch"] == torch.__version__ and cpu["cuda_build"] == torch.version.cuda
    assert cpu["cuda_available"] is torch.cuda.is_available()
    assert cpu["device"] == "cpu" and cpu["device_name"] == "cpu"
    assert cpu["threads"] == torch.get_num_threads()
    assert 0 < cpu["memory_free_bytes"] <= cpu["memory_total_bytes"]


def test_times_an_empirical_ntk_and_a_float32_gemm(cpu):
    k, g = cpu["ntk"], cpu["gemm"]
    assert (k["n"], k["d"], k["width"], k["arch"], k["attention"]) == (24, 8, 32, "attn", "linear")
    assert k["finite"] and k["symmetric"]
    assert math.isfinite(k["seconds"]) and k["seconds"] > 0
    assert g["size"] == 64 and g["dtype"] == "float32" and g["seconds"] > 0
    flops = 2 * 64**3 / g["seconds"]
    assert g["gflops"] == pytest.approx(flops / 1e9) and g["vs_reference_cpu"] == pytest.approx(flops / SPEED_GEMM_FLOPS)


def test_is_strict_json_and_reads_as_lines(cpu):
    assert json.loads(json.dumps(cpu, allow_nan=False)) == cpu
    text = describe(cpu)
    assert text.startswith(f"torch {torch.__version__}") and "empirical NTK, 24 x 24 at width 32" in text
    assert "GEMM float32 64^3" in text and "NOT finite" not in text


def test_a_cuda_build_without_a_gpu_says_what_the_host_needs(cpu):
    cuda = torch.version.cuda
    if not cuda or torch.cuda.is_available():
        assert cpu["hint"] is None
        return
    major = cuda.split(".")[0]
    assert f"CUDA {cuda}" in cpu["hint"] and f">= {CUDA_DRIVER[major]}" in cpu["hint"]
    if major == "13":  # the pinned torch's default wheel; NVIDIA: CUDA 13.x needs driver >= 580
        assert ">= 580" in cpu["hint"]
    assert "--gpus all" in cpu["hint"] and "--device nvidia.com/gpu=all" in cpu["hint"]
    assert "hint: " in describe(cpu)


@pytest.mark.parametrize("kwargs, name", [({"n": 1}, "n"), ({"width": 0}, "width"), ({"repeats": 0}, "repeats"),
                                          ({"gemm": -4}, "gemm"), ({"d": 2.5}, "d")])
def test_bad_sizes_are_one_line_errors_naming_the_value(kwargs, name):
    with pytest.raises(BadInput) as e:
        report("cpu", **{**SMALL, **kwargs})
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"doctor: {name} must be an integer >=")
    assert repr(next(iter(kwargs.values()))) in text


def test_a_bad_device_names_the_allowed_ones():
    with pytest.raises(BadInput) as e:
        report("tpu", **SMALL)
    assert "'tpu'" in str(e.value) and "auto, cpu, cuda" in str(e.value)


@requires_cuda
@pytest.mark.cuda
def test_on_a_gpu_reports_its_name_memory_and_timings():
    r = report("cuda", **SMALL)
    assert r["device"].startswith("cuda") and r["device_name"] == torch.cuda.get_device_name()
    assert r["cuda_available"] and r["cuda_devices"] >= 1 and r["hint"] is None
    assert 0 < r["memory_free_bytes"] <= r["memory_total_bytes"]
    assert r["ntk"]["finite"] and r["ntk"]["symmetric"] and r["gemm"]["seconds"] > 0


def test_the_cli_prints_the_report_as_json_or_lines(capsys):
    from engine.cli import main

    assert main(["doctor", "--json", "--device", "cpu"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["device"] == "cpu" and r["ntk"]["finite"] and r["gemm"]["size"] == 1024
    assert main(["doctor", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("torch ") and "empirical NTK, 256 x 256" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA GPU")
def test_the_cli_asked_for_cuda_without_a_gpu_exits_2_with_one_line(capsys):
    from engine.cli import main

    assert main(["doctor", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: device 'cuda' requested") and "\n" not in err


def test_the_cli_help_prints(capsys):
    from engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["doctor", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage:") and "--json" in out and "--device" in out
