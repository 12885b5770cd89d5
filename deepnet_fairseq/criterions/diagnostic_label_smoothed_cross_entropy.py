"""``diagnostic_label_smoothed_cross_entropy``: fairseq's label-smoothed cross-entropy (same loss; this
subclasses it) plus training-stability diagnostics, each off by default and free when off:

  --diag-grad-norms             gnorm_<sublayer>: gradient norm of each sublayer (Pre-LN paper, Fig. 3),
                                gnorm_total: over all parameters
  --diag-update-norm-interval K update_norm: ||F(x,theta_t) - F(x,theta_0)|| on a fixed probe batch
                                every K updates (DeepNet, Figs. 4-5)
  --diag-ln-inputs              lnin_<sublayer>: mean norm of each sublayer LayerNorm's input (DeepNet, Fig. 3)
  --diag-source-dependence-interval K
                                src_dep: target NLL (bits/token) with the batch's sources shuffled minus with
                                the true ones (0: the decoder ignores the encoder), and xattn_<layer>: each
                                decoder layer's cross-attention output over the residual it joins; every K
                                updates, eval mode, on that update's first micro-batch
  --divergence-guard            stop on a non-finite loss or gradient, or one beyond the bounds below,
  --divergence-loss-bound B     naming the update and the sublayer where it started; fairseq's saved
  --divergence-grad-bound B     checkpoints are left as they were (the last good one stays loadable).
                                In fp16 it names where each skipped (overflowing) step's gradient
                                overflow starts, and stops when the loss scale reaches its minimum
  --divergence-skip-batch       drop a bad micro-batch's loss instead of stopping (loss checks)
  --divergence-rollback N       instead of stopping, skip the diverged update and go on from the last
  --divergence-rollback-lr-factor F   good state, at most N times per run, optionally multiplying the
                                learning rate by F each time (deepnet_fairseq/training/rollback.py)
  --divergence-loss-spike F     an update whose loss per token is over F times the running average of
                                the updates before it diverged (rank-independent; the average is saved)
  --divergence-fp16-fallback P  fp16 at the minimum loss scale: go on in P (bf16 or fp32) from the same
                                fp32 master weights, once, instead of stopping

and one change to the loss, off by default (bitwise today's loss and no extra forward when off):

  --crossconst-alpha A          CrossConST (Gao et al. 2023): add A x KL(f(x) || f(y)) over the target
                                positions, f(y) from a second forward with the target as the source;
                                crossconst: that KL per token in bits (criterions/crossconst.py)

Everything goes through fairseq's metrics (progress bar, JSON log, tensorboard). Values that come
from the forward pass travel in the logging outputs, which fairseq sums over micro-batches and
workers; they are divided by their counts in ``reduce_metrics``. Gradient norms are read after
fairseq's all-reduce, so they are identical on every worker and logged directly. See
docs/diagnostics.md.
"""

import logging
import math
from dataclasses import dataclass, field

from fairseq import metrics, utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
    label_smoothed_nll_loss,
)

from ..instrumentation.monitors import (
    DivergenceError,
    GradNormMonitor,
    MinimumLossScale,
    LayerNormInputMonitor,
    UpdateNormProbe,
    describe_nonfinite,
    locate_divergence,
    source_dependence,
)
from ..instrumentation.reliability_config import ReliabilityConfig
from ..instrumentation.sublayers import unwrap
from .crossconst import TargetAsSource, divergence

logger = logging.getLogger(__name__)

LN_PREFIX = "lnin_"
GRAD_PREFIX = "gnorm_"
XATTN_PREFIX = "xattn_"


@dataclass
class DiagnosticLabelSmoothedCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig, ReliabilityConfig):
    diag_grad_norms: bool = field(default=False, metadata={"help": "log the gradient norm of every sublayer"})
    diag_update_norm_interval: int = field(
        default=0, metadata={"help": "every K updates, log ||F(x,theta_t)-F(x,theta_0)|| on a fixed probe batch (0: off)"}
    )
    diag_ln_inputs: bool = field(default=False, metadata={"help": "log the mean input norm of every sublayer LayerNorm"})
    diag_source_dependence_interval: int = field(
        default=0, metadata={"help": "every K updates, log src_dep (NLL with shuffled sources minus NLL, bits) and "
                                     "xattn_<layer> (cross-attention output / residual norm) (0: off)"}
    )
    divergence_guard: bool = field(
        default=False, metadata={"help": "stop training on a non-finite (or out-of-bound) loss or gradient norm"}
    )
    divergence_loss_bound: float = field(
        default=0.0, metadata={"help": "with --divergence-guard: a loss per token (base 2) above this diverged (0: off)"}
    )
    divergence_grad_bound: float = field(
        default=0.0, metadata={"help": "with --divergence-guard: a total gradient norm above this diverged (0: off)"}
    )
    divergence_skip_batch: bool = field(
        default=False, metadata={"help": "with --divergence-guard: skip a micro-batch with a bad loss instead of stopping"}
    )
    # --divergence-rollback, --divergence-rollback-lr-factor, --divergence-loss-spike, --divergence-fp16-fallback:
    # ReliabilityConfig (training/rollback.py acts on them; the checks below need --divergence-guard)
    crossconst_alpha: float = field(
        default=0.0, metadata={"help": "CrossConST: add alpha x KL(f(x) || f(y)), f(y) given the target sentence as the "
                                       "source, to the training loss; logged as crossconst (0: off)"}
    )


def _current_update():
    """fairseq's update counter, as the trainer last logged it to the active aggregators. Not
    ``metrics.get_meter("default", ...)``: a resume's ``metrics.load_state_dict`` replaces the registered
    'default' aggregator by the checkpoint's, frozen at the resumed update, while the trainer keeps
    logging to the active one."""
    values = [getattr(agg.get("num_updates"), "val", None) for agg in metrics.get_active_aggregators()]
    return int(max((v for v in values if v is not None), default=0))


@register_criterion("diagnostic_label_smoothed_cross_entropy", dataclass=DiagnosticLabelSmoothedCrossEntropyConfig)
class DiagnosticLabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        ignore_prefix_size=0,
        report_accuracy=False,
        diag_grad_norms=False,
        diag_update_norm_interval=0,
        diag_ln_inputs=False,
        diag_source_dependence_interval=0,
        divergence_guard=False,
        divergence_loss_bound=0.0,
        divergence_grad_bound=0.0,
        divergence_skip_batch=False,
        divergence_rollback=0,
        divergence_rollback_lr_factor=1.0,
        divergence_loss_spike=0.0,
        divergence_fp16_fallback="none",
        crossconst_alpha=0.0,
    ):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        for option, value in (("--diag-update-norm-interval", diag_update_norm_interval),
                              ("--diag-source-dependence-interval", diag_source_dependence_interval),
                              ("--divergence-loss-bound", divergence_loss_bound),
                              ("--divergence-grad-bound", divergence_grad_bound),
                              ("--divergence-loss-spike", divergence_loss_spike),
                              ("--crossconst-alpha", crossconst_alpha)):
            if value < 0 or not math.isfinite(value):
                raise ValueError(f"{option} must be >= 0 (0 = off), got {value!r}")
        divergence_fp16_fallback = str(divergence_fp16_fallback)
        if (divergence_loss_bound or divergence_grad_bound or divergence_skip_batch or divergence_rollback
                or divergence_loss_spike or divergence_fp16_fallback != "none") and not divergence_guard:
            raise ValueError("--divergence-loss-bound/--divergence-grad-bound/--divergence-skip-batch/"
                             "--divergence-rollback/--divergence-loss-spike/--divergence-fp16-fallback "
                             "need --divergence-guard")
        if 0 < divergence_loss_spike <= 1:
            raise ValueError(f"--divergence-loss-spike must be > 1 (0 = off), got {divergence_loss_spike!r}")
        if divergence_rollback < 0 or not 0 < divergence_rollback_lr_factor <= 1:
            raise ValueError(f"--divergence-rollback must be >= 0 and --divergence-rollback-lr-factor in (0, 1], "
                             f"got {divergence_rollback!r} and {divergence_rollback_lr_factor!r}")
        self.diag_grad_norms = diag_grad_norms
        self.update_norm_interval = diag_update_norm_interval
        self.diag_ln_inputs = diag_ln_inputs
        self.source_dependence_interval = diag_source_dependence_interval
        self.guard = divergence_guard
        self.loss_bound = divergence_loss_bound
        self.grad_bound = divergence_grad_bound
        self.skip_batch = divergence_skip_batch
        self.rollback = divergence_rollback > 0  # a bad loss then poisons the gradient (training/rollback.py)
        self._update_loss = (0.0, 0.0)  # this update's good micro-batches: loss sum (nats), sample size
        self._divergence = None  # what the loss check found in this update (rollback mode)
        self._attached = False
        self._probe = UpdateNormProbe() if diag_update_norm_interval else None
        self._probed_update = None
        self._source_probed_update = None
        self.crossconst_alpha = crossconst_alpha
        # how the target-as-source input is built for this task's batches (refused here, before training, if it cannot)
        self._target_as_source = TargetAsSource(task) if crossconst_alpha > 0 else None

    @property
    def _needs_hooks(self):
        return (self.diag_grad_norms or self.update_norm_interval or self.diag_ln_inputs or self.guard
                or self.source_dependence_interval)

    def _attach(self, model):
        """Hooks are attached at the first training forward (the criterion is built before the model)."""
        self._attached = True
        self._grad_monitor = (GradNormMonitor(model, self._on_grads, self._on_overflow if self.guard else None)
                              if self.diag_grad_norms or self.guard else None)
        self._ln_monitor = LayerNormInputMonitor(model) if self.diag_ln_inputs else None
        layers = getattr(getattr(unwrap(model), "decoder", None), "layers", None) or []
        self._cross_layers = [i for i, layer in enumerate(layers) if getattr(layer, "encoder_attn", None) is not None]

    def forward(self, model, sample, reduce=True):
        if not (model.training and self._needs_hooks):
            return self._loss(model, sample, reduce)
        if not self._attached:
            self._attach(model)
        update = _current_update()
        probe_now = (self._probe is not None and update % self.update_norm_interval == 0
                     and self._probed_update != update)
        update_norm = None
        if probe_now:  # before this update's forward: F(x, theta_update), first micro-batch only
            self._probed_update = update
            update_norm = self._probe.measure(model, sample)
        source = None
        if (self.source_dependence_interval and update % self.source_dependence_interval == 0
                and self._source_probed_update != update):
            self._source_probed_update = update
            source = source_dependence(model, sample)

        loss, sample_size, logging_output = self._loss(model, sample, reduce)

        if self.guard:
            loss, logging_output = self._check_loss(model, sample, loss, sample_size, logging_output, update)
        if self._probe is not None:  # always present, so every worker's logging outputs have the same keys
            logging_output["update_norm_sum"] = update_norm or 0.0
            logging_output["update_norm_n"] = 1 if update_norm is not None else 0
        if self._ln_monitor is not None:
            for name, value in self._ln_monitor.collect().items():
                logging_output[LN_PREFIX + name] = value.item()
            logging_output["lnin_n"] = 1
        if self.source_dependence_interval:  # same keys on every worker and micro-batch
            src_dep, cross_ratio = source or (0.0, {})
            logging_output["src_dep_sum"] = src_dep
            logging_output["src_dep_n"] = 1 if source else 0
            for index in self._cross_layers:
                logging_output[f"{XATTN_PREFIX}{index}"] = cross_ratio.get(index, 0.0)
        return loss, sample_size, logging_output

    def _loss(self, model, sample, reduce):
        """fairseq's label-smoothed cross-entropy (its own forward: nothing else runs when CrossConST is off or
        in evaluation), or, with --crossconst-alpha in training, the same plus CrossConST's term."""
        if not (self.crossconst_alpha > 0 and model.training):
            return super().forward(model, sample, reduce=reduce)
        # fairseq's LabelSmoothedCrossEntropyCriterion.forward (compute_loss's two lines, keeping its log-probabilities
        # for the term), with the term added to the loss
        net_output = model(**sample["net_input"])
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, target, self.eps, ignore_index=self.padding_idx, reduce=reduce)
        kl = self._crossconst(model, lprobs, target, sample, reduce)
        loss = loss + self.crossconst_alpha * kl.view_as(loss)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "crossconst": kl.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    def _crossconst(self, model, lprobs, target, sample, reduce):
        """KL(f(x) || f(y)) summed over the target positions (``lprobs``, ``target``: the cross-entropy's, x given):
        a second forward, on the target as the source."""
        ln_monitor = getattr(self, "_ln_monitor", None)
        ln_values = ln_monitor.collect() if ln_monitor is not None else None  # the first forward's, logged
        mirror_output = model(**self._target_as_source(sample))
        if ln_monitor is not None:
            ln_monitor.values = ln_values
        lprobs_y, _ = self.get_lprobs_and_target(model, mirror_output, sample)  # --ignore-prefix-size as for x
        return divergence(lprobs, lprobs_y, target, self.padding_idx, reduce)

    def _check_loss(self, model, sample, loss, sample_size, logging_output, update):
        loss_sum = loss.item()
        per_token = loss_sum / max(float(sample_size), 1.0) / math.log(2)
        bad = not math.isfinite(per_token) or (self.loss_bound and per_token > self.loss_bound)
        logging_output["skipped_batches"] = 0
        if not bad:
            self._update_loss = (self._update_loss[0] + loss_sum, self._update_loss[1] + float(sample_size))
            return loss, logging_output
        where = locate_divergence(model, sample)
        what = f"loss {per_token:.4g} per token" + ("" if math.isfinite(per_token) else " (non-finite)")
        if self.loss_bound and math.isfinite(per_token):
            what += f" > --divergence-loss-bound {self.loss_bound:g}"
        if self.skip_batch:
            logger.warning(f"divergence guard: update {update + 1}: {what}; {where}; skipping this micro-batch")
            # zero loss that still reaches every parameter (fairseq's ignore_grad idiom, NaN-safe)
            zero = sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
            logging_output.update(loss=zero.detach(), nll_loss=zero.detach(), skipped_batches=1)
            if "crossconst" in logging_output:
                logging_output["crossconst"] = zero.detach()
            return zero, logging_output
        if self.rollback:
            # no rank may stop alone: a non-finite gradient makes every rank's gradient non-finite after
            # the all-reduce, so all of them roll back this update together (training/rollback.py)
            self._divergence = f"{what}; {where}"
            return loss * float("nan"), logging_output
        raise DivergenceError(f"training diverged at update {update + 1}: {what}; {where}. "
                              "The last saved checkpoint is untouched.")

    # The interface training/rollback.py uses: take_update_loss, take_divergence, sublayer_grad_norms.
    def take_update_loss(self):
        """(loss sum in nats, sample size) of this rank's good micro-batches since the last call."""
        found, self._update_loss = self._update_loss, (0.0, 0.0)
        return found

    def take_divergence(self):
        """What the loss check found in the update that just failed (None: not the loss), and forget it."""
        found, self._divergence = self._divergence, None
        return found

    def sublayer_grad_norms(self):
        """{sublayer: norm} of the gradient in place now (None without a gradient monitor)."""
        monitor = getattr(self, "_grad_monitor", None)
        return None if monitor is None else monitor._norms([(i, p.grad) for i, p in enumerate(monitor.params)])[0]

    def _on_grads(self, norms, total):
        update = _current_update() + 1
        if self.diag_grad_norms:
            for name, value in norms.items():
                metrics.log_scalar(GRAD_PREFIX + name, value, priority=1000, round=8)
            metrics.log_scalar(GRAD_PREFIX + "total", total, priority=1000, round=8)  # = fairseq's gnorm (no clip)
        if not self.guard:
            return
        if not all(math.isfinite(v) for v in norms.values()):
            raise DivergenceError(f"training diverged at update {update}: {describe_nonfinite(norms)}. "
                                  "The last saved checkpoint is untouched.")
        if self.grad_bound and total > self.grad_bound:
            top = max(norms, key=norms.get) if norms else "(none)"
            raise DivergenceError(
                f"training diverged at update {update}: gradient norm {total:.4g} > --divergence-grad-bound "
                f"{self.grad_bound:g}; largest in sublayer {top} ({norms.get(top, float('nan')):.4g}). "
                "The last saved checkpoint is untouched.")

    def _on_overflow(self, norms, fatal, scaler):
        """fp16: fairseq's loss scaler skips this step (``fatal``: and is about to stop training)."""
        update = _current_update() + 1
        if not fatal:
            logger.info(f"divergence guard: update {update}: fp16 gradient overflow, {describe_nonfinite(norms)}; "
                        f"step skipped, loss scale now {scaler.loss_scale:g}")
            return
        raise MinimumLossScale(
            f"training diverged at update {update}: the fp16 gradient still overflows at the minimum loss scale "
            f"(--min-loss-scale {scaler.min_loss_scale:g}), {describe_nonfinite(norms)}. "
            "The last saved checkpoint is untouched.")

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        if not logging_outputs:
            return

        def total(key):
            return sum(float(log.get(key, 0)) for log in logging_outputs)

        if any("crossconst" in log for log in logging_outputs):  # training with --crossconst-alpha: as fairseq's loss
            sample_size = total("sample_size")
            metrics.log_scalar("crossconst", total("crossconst") / max(sample_size, 1.0) / math.log(2), sample_size,
                               round=3)
        n = total("update_norm_n")
        if n > 0:
            metrics.log_scalar("update_norm", total("update_norm_sum") / n, priority=900, round=4)
        n = total("src_dep_n")
        if n > 0:
            metrics.log_scalar("src_dep", total("src_dep_sum") / n, priority=900, round=4)
            for key in logging_outputs[0]:
                if key.startswith(XATTN_PREFIX):
                    metrics.log_scalar(key, total(key) / n, priority=1100, round=4)
        n = total("lnin_n")
        if n > 0:
            for key in logging_outputs[0]:
                if key.startswith(LN_PREFIX) and key != "lnin_n":
                    metrics.log_scalar(key, total(key) / n, priority=1100, round=3)
        if any("skipped_batches" in log for log in logging_outputs):
            metrics.log_scalar_sum("skipped_batches", total("skipped_batches"), priority=800, round=0)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
