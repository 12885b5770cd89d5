"""The benchmark code runs on a tiny shape and reports finite, sensible values.

Nothing here depends on wall-clock speed: timings are only checked to be finite and positive;
memory is counted from torch's allocator events, which do not depend on speed.
"""

import math

import pytest

from benchmarks import depth_scaling, gpu, throughput
from benchmarks.common import FAMILIES
from deepnet_fairseq.models import deepnorm_constants


@pytest.fixture(scope="module")
def tiny_comparison():
    return throughput.compare("tiny", list(FAMILIES), rounds=2, steps=1, warmup=1, device="cpu", log=lambda s: None)


def test_throughput_reports_finite_ratios_for_identical_shapes(tiny_comparison):
    models = tiny_comparison["models"]
    assert list(models) == list(FAMILIES)
    # identical shape: DeepNorm adds no parameters; Pre-LN adds only its two final LayerNorms (2 x 2 x d)
    assert models["deepnet_transformer"]["parameters"] == models["transformer"]["parameters"]
    assert models["preln_transformer"]["parameters"] - models["transformer"]["parameters"] == 2 * 2 * 32
    for arch in ("deepnet_transformer", "preln_transformer"):
        for clock in ("wall", "cpu"):
            ratio = models[arch][f"throughput_ratio_{clock}"]
            assert ratio["n"] == 2
            assert all(math.isfinite(ratio[k]) and ratio[k] > 0 for k in ("median", "min", "max"))
        assert math.isfinite(models[arch]["last_loss"])


def test_deepnorm_costs_no_activation_memory(tiny_comparison):
    models = tiny_comparison["models"]
    base, deep = models["transformer"], models["deepnet_transformer"]
    # x * alpha is not saved for backward (the scale is a constant): same activations, same peak
    assert deep["saved_activation_bytes"] == pytest.approx(base["saved_activation_bytes"], rel=0.005)
    assert deep["peak_memory_ratio"] == pytest.approx(1.0, abs=0.01)
    assert base["peak_bytes"] > base["saved_activation_bytes"] > 0


def test_depth_scaling_one_configuration_with_and_without_checkpointing():
    plain = depth_scaling.measure_one(3, checkpoint_activations=False, timed_steps=1)
    ckpt = depth_scaling.measure_one(3, checkpoint_activations=True, timed_steps=1)
    expected = deepnorm_constants(3, 3)
    for row in (plain, ckpt):
        assert row["all_losses_finite"] and row["all_grad_norms_finite"]
        assert row["encoder_alpha"] == pytest.approx(expected.encoder_alpha)
        assert row["decoder_alpha"] == pytest.approx(expected.decoder_alpha)
        assert row["s_per_update"] > 0 and row["cpu_s_per_update"] > 0
    assert plain["parameters"] == ckpt["parameters"]
    assert plain["persistent_mib"] == pytest.approx(ckpt["persistent_mib"], rel=0.01)
    # checkpointing keeps only layer inputs for backward
    assert ckpt["saved_for_backward_mib"] < 0.5 * plain["saved_for_backward_mib"]
    assert ckpt["activation_mib"] < plain["activation_mib"]


def test_linear_fit_and_gpu_peak_table():
    a, b, r2 = depth_scaling.linear_fit([1, 2, 3, 4], [3, 5, 7, 9])
    assert (a, b, r2) == pytest.approx((1, 2, 1))
    assert gpu.peak_tflops("NVIDIA H200") == 989.0
    assert gpu.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert gpu.peak_tflops("Some Future GPU") is None
