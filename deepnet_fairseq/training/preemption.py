"""Save and exit on a signal (SLURM preemption or time limit), so a requeued run loses no update.

SLURM sends SIGTERM before it kills a job (and SIGUSR1, or any signal, ahead of the time limit with
``#SBATCH --signal=B:USR1@120``). fairseq 0.12 handles no signal, so the run died and resumed from
its last interval checkpoint. With the plugin, fairseq-train (any task) notes the signal and goes
on to the end of the update it is in; then every rank agrees to stop (``train_loop``: one
all-reduce of a flag per update, so no rank saves at a different update), rank 0 saves the
exact-resume state to ``checkpoint_last.pt``, logs one line and every rank exits with
``PREEMPTED_EXIT_STATUS`` (75, ``EX_TEMPFAIL``: try again). The setups' launcher requeues the SLURM
job (``scontrol requeue``) when that status comes back. ``--save-on-signals`` (``ReliabilityConfig``)
picks the signals or turns this off.

SLURM's preemption and a process-group kill signal every process, DataLoader workers too. torch's
worker dies of a SIGTERM not sent by its parent, and the trainer then raises before it can save; so
a child forked after ``install`` (a worker) blocks the signals and a thread of its own waits for
them: one from its parent ends it (as torch's worker does: multiprocessing terminates its daemonic
children at exit), any other is left to the trainer, which then stops its workers itself.
"""

import logging
import os
import signal
import threading

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_STATUS = 75  # sysexits.h EX_TEMPFAIL; deepnet_setups.runner.PREEMPTED_EXIT_STATUS too


def parse_signals(text):
    """``"SIGUSR1,SIGTERM"`` (or ``USR1,TERM``) -> [Signals]; ``""`` / ``"none"`` -> []."""
    text = (text or "").strip()
    if text.lower() in ("", "none", "off"):
        return []
    found = []
    for name in text.split(","):
        name = name.strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if not hasattr(signal.Signals, name) or name in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"--save-on-signals: '{name}' is not a signal that can be caught "
                             "(e.g. SIGUSR1,SIGTERM; 'none' turns saving on a signal off)")
        found.append(signal.Signals[name])
    return found


class SignalRequest:
    """Remembers the first of the given signals received; the training loop polls ``received``."""

    def __init__(self):
        self.received = None
        self.signals = []
        self._fork_hook = False

    def install(self, signals):
        self.signals = list(signals)
        for sig in self.signals:
            signal.signal(sig, self._handle)
        if self.signals and not self._fork_hook:
            os.register_at_fork(after_in_child=self._leave_to_parent)
            self._fork_hook = True

    def _leave_to_parent(self):
        if not self.signals:  # installed again with none since the hook was registered
            return
        signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)  # the thread below inherits the mask
        threading.Thread(target=_end_on_parents_signal, args=(os.getppid(), self.signals), daemon=True).start()

    def _handle(self, signum, frame):
        if self.received is None:  # a signal handler only notes it: the loop acts at an update boundary
            self.received = signal.Signals(signum).name


def _end_on_parents_signal(parent, signals):
    while signal.sigwaitinfo(signals).si_pid != parent:
        pass
    os._exit(0)


request = SignalRequest()
