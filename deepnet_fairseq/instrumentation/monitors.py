"""Training-stability monitors, attached with torch hooks (nothing of fairseq's forward is copied).

- ``GradNormMonitor``: per-sublayer gradient norms, read in a global optimizer step pre-hook. At that
  point fairseq has summed the ``--update-freq`` micro-batches, all-reduced across workers and divided
  by the sample size, so every worker sees the same gradient the optimizer applies. fp16 optimizers
  either unscale before the step or pass ``scale=`` to it; both are undone here, and fp16's fp32
  master copies (flat or not) are mapped back to the model's parameters by order.
  ``--clip-norm`` has already been applied: with clipping on, these are clipped norms. With
  ``on_overflow``, an fp16 step that fairseq's loss scaler skips for a non-finite gradient (no optimizer
  step runs then) is reported too, read from the model's gradients before fairseq zeroes them.
- ``LayerNormInputMonitor``: forward pre-hooks on each sublayer's LayerNorm record the mean L2 norm
  (over positions) of its input.
- ``UpdateNormProbe``: ``||F(x, theta_t) - F(x, theta_0)||`` on a fixed probe batch, F = the top
  decoder layer's output (``features_only``), eval mode; only F(x, theta_0) is kept.
- ``source_dependence``: target NLL with the batch's sources shuffled minus with the true ones, and
  each decoder layer's cross-attention output against the residual stream it joins.
"""

import functools
import math
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .sublayers import transformer_sublayers, unwrap


class DivergenceError(RuntimeError):
    """Training diverged; the message names the update and the sublayer where it started."""


class MinimumLossScale(DivergenceError):
    """fp16: the gradient still overflows at ``--min-loss-scale`` (fairseq would stop here)."""


def _mean_token_norm(x, mask=None):
    norms = x.detach().float().norm(dim=-1)
    if mask is not None:
        return (norms * mask).sum() / mask.sum().clamp(min=1)
    return norms.mean()


def describe_nonfinite(norms):
    """Where a non-finite gradient starts: the non-finite sublayer nearest the output (``norms`` in
    execution order), since the backward pass carries an overflow down to every sublayer below it."""
    bad = [name for name, value in norms.items() if not math.isfinite(value)]
    if not bad:
        return "no sublayer's gradient is non-finite (the overflow is outside the layers, e.g. the embeddings)"
    return f"non-finite gradient in {len(bad)} of {len(norms)} sublayers, starting at sublayer {bad[-1]}"


_overflow_watchers = weakref.WeakSet()


def _watch_loss_scaler():
    """Wrap fairseq's ``DynamicLossScaler.check_overflow`` once: on an overflow it tells the watching
    monitors, while the gradients are still there (fairseq's trainer zeroes them right after)."""
    from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler

    check_overflow = DynamicLossScaler.check_overflow
    if getattr(check_overflow, "deepnet_watched", False):
        return

    @functools.wraps(check_overflow)
    def watched(scaler, grad_norm):
        try:
            return check_overflow(scaler, grad_norm)
        except (OverflowError, FloatingPointError) as overflow:
            for monitor in list(_overflow_watchers):
                monitor._on_overflow(scaler, overflow)
            raise

    watched.deepnet_watched = True
    DynamicLossScaler.check_overflow = watched


class GradNormMonitor:
    """Calls ``on_grads(norms, total)`` with per-sublayer gradient norms before each optimizer step.

    ``norms`` maps sublayer name -> float in execution order (non-finite values are kept); ``total`` is
    the norm over all of the optimizer's parameters. ``on_overflow(norms, fatal, scaler)``, if given, is
    called when fairseq's fp16 loss scaler skips a step for a non-finite gradient (``fatal``: the scale is
    at ``--min-loss-scale``, fairseq is about to stop); its norms are of the loss-scaled gradients. The
    hooks hold only weak references to their owner.
    """

    def __init__(self, model, on_grads, on_overflow=None):
        model = unwrap(model)
        self.params = [p for p in model.parameters() if p.requires_grad]
        owner_of = {}
        sublayers = transformer_sublayers(model)
        for sub in sublayers:
            for p in sub.parameters():
                owner_of.setdefault(id(p), sub.name)
        self.owners = [owner_of.get(id(p)) for p in self.params]
        owning = set(self.owners)
        self.names = [sub.name for sub in sublayers if sub.name in owning]  # execution order
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.on_grads = on_grads
        self.on_overflow = on_overflow
        self_ref = weakref.ref(self)

        def hook(optimizer, args, kwargs):
            monitor = self_ref()
            if monitor is not None:
                monitor._step_pre_hook(optimizer, kwargs)

        self.handle = register_optimizer_step_pre_hook(hook)
        if on_overflow is not None:
            _watch_loss_scaler()
            _overflow_watchers.add(self)

    def remove(self):
        self.handle.remove()
        _overflow_watchers.discard(self)

    def _norms(self, pairs, scale=1.0):
        """(per-sublayer norms, total norm) of (parameter index, gradient) pairs, divided by ``scale``."""
        squares = dict.fromkeys(self.names, 0.0)
        total = 0.0
        grads = [(i, g) for i, g in pairs if g is not None]
        norms = torch.stack([g.detach().float().norm() for _, g in grads]).tolist() if grads else []
        for (i, _), norm in zip(grads, norms):
            sq = (norm / scale) ** 2
            total += sq
            if self.owners[i] is not None:
                squares[self.owners[i]] += sq
        return {n: math.sqrt(s) for n, s in squares.items()}, math.sqrt(total)

    def _on_overflow(self, scaler, overflow):
        pairs = [(i, p.grad) for i, p in enumerate(self.params) if p.grad is not None]
        if pairs:  # else the scaler belongs to another model's optimizer
            self.on_overflow(self._norms(pairs)[0], isinstance(overflow, FloatingPointError), scaler)

    def _model_grads(self, optimizer):
        """(model parameter index, gradient) pairs, or None if this optimizer is not the model's."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if params and all(id(p) in self.index for p in params):  # fp32: the model's own parameters
            return [(self.index[id(p)], p.grad) for p in params]
        # fp16: fp32 master copies of (model + criterion) parameters, flat or one per parameter, in order
        if sum(p.numel() for p in params) < sum(p.numel() for p in self.params) or not params:
            return None
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
                          for p in params])
        pairs, offset = [], 0
        for i, p in enumerate(self.params):
            pairs.append((i, flat[offset:offset + p.numel()]))
            offset += p.numel()
        return pairs

    def _step_pre_hook(self, optimizer, kwargs):
        pairs = self._model_grads(optimizer)
        if pairs is None:
            return
        scale = kwargs.get("scale", 1.0) or 1.0  # fused fp16 steps receive 1/multiply_factor as scale
        self.on_grads(*self._norms(pairs, scale))


class LayerNormInputMonitor:
    """Forward pre-hooks on every sublayer LayerNorm; ``collect()`` returns and clears the last values."""

    def __init__(self, model):
        self.values = {}
        self.handles = []
        for sub in transformer_sublayers(model):
            if sub.layer_norm is None:
                continue
            self.handles.append(sub.layer_norm.register_forward_pre_hook(self._hook(sub.name)))

    def _hook(self, name):
        def hook(module, inputs):
            if module.training:
                self.values[name] = _mean_token_norm(inputs[0])
        return hook

    def collect(self):
        values, self.values = self.values, {}
        return values

    def remove(self):
        for handle in self.handles:
            handle.remove()


class UpdateNormProbe:
    """Mean per-token ``||F(x, theta_t) - F(x, theta_0)||`` on the first batch it is given."""

    def __init__(self):
        self.net_input = None
        self.mask = None
        self.initial = None

    @torch.no_grad()
    def _features(self, model):
        model = unwrap(model)
        was_training = model.training
        model.eval()
        try:
            return model(**self.net_input, features_only=True)[0].float()
        finally:
            model.train(was_training)

    def measure(self, model, sample):
        """The update norm now (0.0 at the first call, which fixes the probe batch and F(x, theta_0))."""
        if self.initial is None:
            self.net_input = {k: v for k, v in sample["net_input"].items()}
            pad = unwrap(model).decoder.dictionary.pad()
            self.mask = self.net_input["prev_output_tokens"].ne(pad).float()
            self.initial = self._features(model)
            return 0.0
        return _mean_token_norm(self._features(model) - self.initial, self.mask).item()


@torch.no_grad()
def source_dependence(model, sample):
    """How much the model uses its source, on one batch in eval mode (``None`` for a 1-sentence batch).

    Returns ``(src_dep, cross_ratio)``: ``src_dep`` is the target NLL (bits per token) with each
    sentence given another sentence's source (the batch's sources rolled by one) minus the NLL with
    its own source: 0 means the decoder ignores the encoder. ``cross_ratio`` maps each decoder layer
    to the mean norm of its cross-attention output over the mean norm of the residual stream it is
    added to (``alpha * x`` in DeepNorm, ``x`` otherwise), with the true sources.
    """
    model = unwrap(model)
    net_input, target = sample["net_input"], sample["target"]
    if "src_tokens" not in net_input or net_input["src_tokens"].size(0) < 2:
        return None
    mask = target.ne(model.decoder.dictionary.pad()).float()
    residual, branch, handles = {}, {}, []
    for index, layer in enumerate(getattr(model.decoder, "layers", None) or []):
        layer = getattr(layer, "_checkpoint_wrapped_module", layer)
        attn = getattr(layer, "encoder_attn", None)
        if attn is None:
            continue
        alpha = float(getattr(layer, "deepnorm_alpha", 1.0))
        if getattr(layer, "normalize_before", False):  # Pre-LN: the residual is the LayerNorm's input
            handles.append(layer.encoder_attn_layer_norm.register_forward_pre_hook(
                lambda m, inputs, i=index: residual.__setitem__(i, _mean_token_norm(inputs[0], mask.t()))))
        else:  # Post-LN placement: the residual is the attention's query
            handles.append(attn.register_forward_pre_hook(
                lambda m, args, kwargs, i=index, a=alpha: residual.__setitem__(
                    i, a * _mean_token_norm(kwargs.get("query", args[0] if args else None), mask.t())),
                with_kwargs=True))
        handles.append(attn.register_forward_hook(
            lambda m, inputs, output, i=index: branch.__setitem__(i, _mean_token_norm(output[0], mask.t()))))

    def nll(inputs):
        lprobs = model.get_normalized_probs(model(**inputs), log_probs=True).float()
        token_nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return (token_nll * mask).sum() / mask.sum().clamp(min=1) / math.log(2)

    was_training = model.training
    model.eval()
    try:
        true = nll(net_input)
        for handle in handles:
            handle.remove()
        handles = []
        rolled = dict(net_input, src_tokens=net_input["src_tokens"].roll(1, 0),
                      src_lengths=net_input["src_lengths"].roll(1, 0))
        src_dep = (nll(rolled) - true).item()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    cross_ratio = {i: (branch[i] / residual[i].clamp(min=1e-12)).item() for i in branch if i in residual}
    return src_dep, cross_ratio


@torch.no_grad()
def locate_divergence(model, sample):
    """Re-run the forward pass with hooks; name the first sublayer (execution order) whose branch or
    LayerNorm output is non-finite, else the sublayer with the largest LayerNorm input magnitude."""
    model = unwrap(model)
    first_nonfinite, largest = [], {}
    handles = []

    def watch(name):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            if not first_nonfinite and torch.is_tensor(out) and not torch.isfinite(out).all():
                first_nonfinite.append(name)
        return hook

    def watch_ln(name):
        def hook(module, inputs):
            largest[name] = _mean_token_norm(inputs[0]).item()
        return hook

    for sub in transformer_sublayers(model):
        for module in sub.branch:
            handles.append(module.register_forward_hook(watch(sub.name)))
        if sub.layer_norm is not None:
            handles.append(sub.layer_norm.register_forward_pre_hook(watch_ln(sub.name)))
            handles.append(sub.layer_norm.register_forward_hook(watch(sub.name)))
    try:
        model(**sample["net_input"])
    finally:
        for handle in handles:
            handle.remove()
    if first_nonfinite:
        return f"first non-finite output in sublayer {first_nonfinite[0]}"
    finite = {k: v for k, v in largest.items() if math.isfinite(v)}
    if finite:
        name = max(finite, key=finite.get)
        return f"largest LayerNorm input in sublayer {name} (mean norm {finite[name]:.3g})"
    return "no sublayer output is non-finite (the loss itself is)"
