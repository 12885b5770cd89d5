"""``--optimizer adam_foreach``: fairseq's Adam, stepped with torch's multi-tensor ``_foreach_*`` ops.

fairseq's ``adam`` (without apex's FusedAdam, i.e. on every CPU and on GPUs without apex) loops over
the parameters in Python, about nine small ops each, and its gradient clipping takes one norm per
parameter: for a deep model (758 parameter tensors at 18L-18L) that is thousands of dispatches, or
kernel launches, per update. This optimizer does the same arithmetic as fairseq's ``Adam`` (decoupled
weight decay, fairseq's bias correction and eps placement, fp32 moments for fp16/bf16 parameters) on
lists of tensors, and computes the gradient norm with ``torch._foreach_norm``. Same options and state
layout as ``adam`` (``--adam-betas``, ``--adam-eps``, ``--weight-decay``); on CPU the updates are
bitwise fairseq's. fairseq stores the optimizer's class with a checkpoint, so switching between
``adam`` and ``adam_foreach`` on resume needs ``--reset-optimizer``.

With ``--fp16``, fairseq's FP16Optimizer already steps one flat fp32 copy of all parameters, so
there is little to gain; with ``--memory-efficient-fp16`` (no fp32 copy) or fp32/bf16 training the
whole step is per parameter and this removes the loop.
"""

import math
from collections import defaultdict
from dataclasses import dataclass

import torch
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig


@dataclass
class FairseqAdamForeachConfig(FairseqAdamConfig):
    pass


@register_optimizer("adam_foreach", dataclass=FairseqAdamForeachConfig)
class FairseqAdamForeach(FairseqAdam):
    def __init__(self, cfg: FairseqAdamForeachConfig, params):
        FairseqOptimizer.__init__(self, cfg)  # not FairseqAdam's: it would pick apex or its own loop
        if cfg.fp16_adam_stats:
            raise ValueError("--fp16-adam-stats needs fairseq's FusedAdamV1; use --optimizer adam")
        self._optimizer = AdamForeach(params, **self.optimizer_config)

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        """fairseq's ``utils.clip_grad_norm_`` with one ``_foreach_norm`` instead of a norm per parameter."""
        params = [p for p in self.params if p.grad is not None]
        if len(params) < 2 or any(hasattr(p, "expert") for p in params) \
                or len({p.grad.device for p in params}) > 1:
            return super().clip_grad_norm(max_norm, aggregate_norm_fn)
        grads = [p.grad.detach() for p in params]
        total_norm = torch.norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))
        if aggregate_norm_fn is not None:
            total_norm = aggregate_norm_fn(total_norm)
        if max_norm > 0:
            torch._foreach_mul_(grads, (float(max_norm) / (total_norm + 1e-6)).clamp_(max=1))
        return total_norm


class AdamForeach(torch.optim.Optimizer):
    """fairseq's ``fairseq.optim.adam.Adam`` (without amsgrad) on lists of tensors."""

    supports_memory_efficient_fp16 = True
    supports_flat_params = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            # tensors that share a device and a step count are updated together
            buckets = defaultdict(lambda: ([], [], [], []))
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                elif state["exp_avg"].device != p.device:  # e.g. loaded from a checkpoint on CPU
                    state["exp_avg"] = state["exp_avg"].to(p.device, torch.float32)
                    state["exp_avg_sq"] = state["exp_avg_sq"].to(p.device, torch.float32)
                state["step"] += 1
                params, grads, exp_avgs, exp_avg_sqs = buckets[(p.device, state["step"])]
                params.append(p)
                grads.append(p.grad if p.grad.dtype == torch.float32 else p.grad.float())
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
            for (_, step), (params, grads, exp_avgs, exp_avg_sqs) in buckets.items():
                self._update(group, step, params, grads, exp_avgs, exp_avg_sqs)
        return loss

    @staticmethod
    def _update(group, step, params, grads, exp_avgs, exp_avg_sqs):
        beta1, beta2 = group["betas"]
        low_precision = [i for i, p in enumerate(params) if p.dtype != torch.float32]
        params32 = list(params)
        for i in low_precision:  # fairseq's Adam updates an fp32 copy and writes it back
            params32[i] = params[i].float()
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denom, group["eps"])
        step_size = group["lr"] * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
        if group["weight_decay"] != 0:
            torch._foreach_add_(params32, params32, alpha=-group["weight_decay"] * group["lr"])
        torch._foreach_addcdiv_(params32, exp_avgs, denom, value=-step_size)
        if low_precision:
            torch._foreach_copy_([params[i] for i in low_precision], [params32[i] for i in low_precision])
