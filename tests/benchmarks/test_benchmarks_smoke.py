"""The benchmark code runs on a tiny shape and reports finite, sensible values.

Nothing here depends on wall-clock speed: timings are only checked to be finite and positive;
memory is counted from torch's allocator events, which do not depend on speed.
"""

import math

import pytest
import torch

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


def skip_first_steps(monkeypatch, skips):
    """fairseq's Trainer skips each trainer's first ``skips`` steps as on fp16 gradient overflow:
    ``train_step`` returns None and the update count does not advance."""
    from fairseq.trainer import Trainer

    real = Trainer.train_step
    calls = {}

    def train_step(self, samples, raise_oom=False):
        calls[id(self)] = calls.get(id(self), 0) + 1
        if calls[id(self)] <= skips:
            return None
        return real(self, samples, raise_oom=raise_oom)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    return calls


def test_gpu_check_retries_a_step_skipped_on_fp16_overflow(monkeypatch):
    skip_first_steps(monkeypatch, 2)
    results = gpu.main(["--smoke", "--rounds", "1", "--steps", "1", "--search-budget-s", "60"])
    ab = results["precision"]["fp32 (smoke)"]
    for arch in ("transformer", "deepnet_transformer"):
        assert ab[arch]["overflow_skips"] == 2  # retried and counted, not reported as out of memory
        assert math.isfinite(ab[arch]["loss"])
    search = results["depth_search"]
    assert search["largest_fit_layers_per_stack"] == 4 and search["smallest_oom_layers_per_stack"] is None
    assert all(record["overflow_skips"] == 2 for record in search["attempts"])


def test_a_step_that_never_stops_overflowing_fails_and_real_oom_is_recognised(monkeypatch):
    from benchmarks.common import Batch, Bench, Shape, is_oom

    bench = Bench("deepnet_transformer", Shape(1, 1, 16, 32, 2), Batch(2, 4, 4, 60))
    skip_first_steps(monkeypatch, Bench.MAX_OVERFLOW_RETRIES + 1)
    with pytest.raises(RuntimeError, match="consecutive steps skipped on gradient overflow") as error:
        bench.step()
    assert not is_oom(error.value)
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))

    def try_depth(layers, *args):  # a real OOM: the depth search records it and bisects
        if layers > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return {"layers_per_stack": layers}

    monkeypatch.setattr(gpu, "try_depth", try_depth)
    search = gpu.largest_depth([], "cpu", None, 60, [2, 4], log=lambda s: None)
    assert search["largest_fit_layers_per_stack"] == 2 and search["smallest_oom_layers_per_stack"] == 4
    assert any("out of memory" in record.get("oom", "") for record in search["attempts"])
