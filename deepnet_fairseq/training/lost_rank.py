"""Name a lost rank and stop, instead of waiting in a collective for gloo's or NCCL's 30-minute timeout.

Each rank of a distributed fairseq-train runs one daemon thread (``Heartbeat``) that bumps its own
counter in the job's rendezvous store (a client of its own, short timeout) and reads every peer's.
A peer whose counter has not moved for ``--lost-rank-timeout`` seconds is lost (killed, its node
gone, or frozen); so is the store when it cannot be reached that long (it lives in rank 0 with
fairseq's ``tcp://`` init, in node 0's torchrun otherwise). The thread then logs one line naming the
rank and ends the process (status ``LOST_RANK_EXIT_STATUS``): the others do the same, and rerunning
the command resumes from the last checkpoint. The thread runs beside the main thread, so a rank busy
in a long save or validation still beats; gloo's "Connection closed by peer" after a ``kill -9``
waits for this verdict (the plugin's exception hook) instead of printing a traceback.
"""

import logging
import os
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from ..instrumentation.monitors import DivergenceError

logger = logging.getLogger(__name__)

LOST_RANK_EXIT_STATUS = 1
KEY = "deepnet_fairseq/heartbeat/{}"


class Heartbeat(threading.Thread):
    def __init__(self, store, rank, world_size, timeout):
        super().__init__(name="deepnet-fairseq-heartbeat", daemon=True)
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.period = max(min(timeout / 6, 10.0), 0.2)
        self.store = store.clone()  # a connection of its own: a blocked call cannot hold up fairseq's
        self.store.set_timeout(timedelta(seconds=max(2 * self.period, 1.0)))
        self.stopped = threading.Event()

    def stop(self):
        """The run is ending on purpose (finished, preempted, a failed save): peers may leave first."""
        self.stopped.set()

    def run(self):
        peers = [r for r in range(self.world_size) if r != self.rank]
        seen = {r: (None, time.monotonic()) for r in peers}  # rank -> (counter, when it last changed)
        store_ok = time.monotonic()
        while not self.stopped.wait(self.period):
            now = time.monotonic()
            try:
                self.store.add(KEY.format(self.rank), 1)
                for r in peers:
                    count = self.store.add(KEY.format(r), 0)  # reads without waiting for the key
                    if count != seen[r][0]:
                        seen[r] = (count, now)
                store_ok = now
            except Exception as err:  # noqa: BLE001  (the store's errors are plain RuntimeErrors)
                if now - store_ok > self.timeout:
                    self._lost(f"lost rank 0: the rendezvous store (rank 0's, or node 0's torchrun) has been "
                               f"unreachable for {now - store_ok:.0f} s ({str(err).splitlines()[0]})")
                continue
            lost = [r for r in peers if now - seen[r][1] > self.timeout]
            if lost:
                ranks = ", ".join(map(str, lost))
                self._lost(f"lost rank {ranks}: no heartbeat for {now - seen[lost[0]][1]:.0f} s "
                           f"(--lost-rank-timeout {self.timeout:g})")

    def _lost(self, what):
        if self.stopped.is_set():
            return
        # sys.__stderr__: while torch's distributed excepthook runs, sys.stderr is its StringIO
        print(f"error: {what}; rank {self.rank} stops; rerun the command to resume from checkpoint_last.pt",
              file=sys.__stderr__, flush=True)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(LOST_RANK_EXIT_STATUS)  # the main thread may be blocked in a collective that never returns


heartbeat = None  # the running Heartbeat, if any


def start(rank, world_size, timeout):
    """Start the heartbeat of this rank (distributed runs with a TCP rendezvous store only)."""
    global heartbeat
    if heartbeat is not None or timeout <= 0 or world_size < 2 or not dist.is_initialized():
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        heartbeat = Heartbeat(store, rank, world_size, timeout)
    except Exception as err:  # noqa: BLE001  (a store that cannot be cloned, e.g. a FileStore)
        logger.warning(f"no lost-rank watchdog: the rendezvous store cannot be shared ({err})")
        return None
    heartbeat.start()
    logger.info(f"lost-rank watchdog: a rank silent for {timeout:g} s stops the run (--lost-rank-timeout)")
    return heartbeat


def stop():
    if heartbeat is not None:
        heartbeat.stop()


def wait_for_verdict():
    """Called after a collective failed: give the heartbeat time to name the lost rank (it exits)."""
    if heartbeat is not None and not heartbeat.stopped.is_set():
        heartbeat.join(heartbeat.timeout + 3 * heartbeat.period)


def collective_failed(kind, value):
    """Whether an uncaught exception is a collective that failed (a peer may be gone: wait for the verdict)."""
    if not issubclass(kind, RuntimeError) or issubclass(kind, DivergenceError):
        return False
    text = str(value)
    return (issubclass(kind, getattr(dist, "DistError", ())) or "gloo" in text or "NCCL" in text
            or any(word in text for word in ("Connection closed", "Connection reset", "Broken pipe", "Timed out")))
