"""The options of the plugin's training reliability (``deepnet_fairseq/training``), in one dataclass.

fairseq parses a plugin's options only from the dataclass of the task, model, criterion, ... that a
command picks. These options were accepted on the ``translation_exact_resume`` task (signals, lost
rank) and on the ``diagnostic_label_smoothed_cross_entropy`` criterion (divergence), so both configs
inherit this mixin: every existing command line parses as before. With both picked, fairseq adds each
flag once (``gen_parser_from_dataclass`` skips an option already added) and fills both configs from
that one flag; ``training`` reads them from whichever of the two has them, or uses these defaults.
It lives here, below ``training`` and ``criterions``, so that neither imports the other.
"""

from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass


@dataclass
class ReliabilityConfig(FairseqDataclass):
    save_on_signals: str = field(
        default="SIGUSR1,SIGTERM",
        metadata={"help": "on any of these signals (comma-separated), finish the current update, save "
                          "checkpoint_last.pt and exit with status 75 so the job can be requeued ('none': off)"},
    )
    lost_rank_timeout: float = field(
        default=60.0,
        metadata={"help": "distributed training: stop every rank, naming the lost one, when a rank has sent "
                          "no heartbeat for this many seconds (killed, node gone, frozen) (0: off)"},
    )
    divergence_rollback: int = field(
        default=0, metadata={"help": "with --divergence-guard: on a divergence, skip the update's batch and go on from "
                                     "the last good model and optimizer state, at most N times per run; the next "
                                     "divergence stops training (0: off, stop at the first)"}
    )
    divergence_rollback_lr_factor: float = field(
        default=1.0, metadata={"help": "with --divergence-rollback: multiply the learning rate by this at each "
                                       "rollback, for the rest of the run (kept in checkpoints)"}
    )
    divergence_loss_spike: float = field(
        default=0.0, metadata={"help": "with --divergence-guard: an update whose loss per token (over all ranks) is "
                                       "above F times the running average of the previous updates' diverged "
                                       "(0: off; the average is kept in checkpoints)"}
    )
    # a speed option of the same training loop (train_loop.start_of_training): a deep Post-LN's vanishing gradients
    # cross float32's denormal range, where CPU arithmetic is several times slower
    flush_denormal: bool = field(
        default=False, metadata={"help": "flush float32 denormals (below 1.2e-38) to zero in this process "
                                         "(torch.set_flush_denormal; CPUs with SSE3), where a deep Post-LN's "
                                         "vanishing gradients make CPU arithmetic several times slower"}
    )
    divergence_fp16_fallback: ChoiceEnum(["none", "bf16", "fp32"]) = field(
        default="none", metadata={"help": "with --divergence-guard and --fp16: when the loss scale reaches its "
                                          "minimum, skip that update and go on in bf16 or fp32 instead of stopping"}
    )
