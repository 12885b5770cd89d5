"""``fairseq-train`` as one torchrun process on CPU (``torchrun -m deepnet_fairseq.setups.cpu_worker ARGS``).

fairseq detects torchrun by itself only with CUDA (it takes the rank modulo the GPU count), so on
CPU each process passes its rank explicitly with env:// initialisation (../shared/ENVIRONMENT.md).
"""

import logging
import os
import sys

from fairseq_cli.train import cli_main

if __name__ == "__main__":
    # fairseq-train's own log format (an earlier import already configured logging, so force it)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout, force=True)
    sys.argv += ["--distributed-init-method", "env://", "--distributed-rank", os.environ["RANK"],
                 "--distributed-no-spawn"]
    cli_main()
