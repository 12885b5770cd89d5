"""``fairseq-train`` as one CPU process of a distributed run: started by torchrun
(``torchrun -m deepnet_setups.cpu_worker ARGS``) or as one SLURM task (``srun python -m ...``).

fairseq reads torchrun's and SLURM's environment by itself only with CUDA (it takes the rank modulo
the GPU count, or counts GPUs per node), so on CPU each process passes its rank and the rendezvous
explicitly (../shared/ENVIRONMENT.md): torchrun's env://, or under SLURM fairseq's own choice, the
first host of the step's node list at ``--distributed-port``.
"""

import argparse
import logging
import os
import subprocess
import sys

from fairseq_cli.train import cli_main


def rank_and_init_method(env, argv):
    if "RANK" in env:  # torchrun
        return env["RANK"], "env://"
    port = argparse.ArgumentParser(add_help=False)
    port.add_argument("--distributed-port", type=int, required=True)
    nodes = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST"))
    master = subprocess.check_output(["scontrol", "show", "hostnames", nodes], text=True).split()[0]
    return env["SLURM_PROCID"], f"tcp://{master}:{port.parse_known_args(argv)[0].distributed_port}"


if __name__ == "__main__":
    # fairseq-train's own log format (an earlier import already configured logging, so force it)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout, force=True)
    rank, init_method = rank_and_init_method(os.environ, sys.argv[1:])
    sys.argv += ["--distributed-init-method", init_method, "--distributed-rank", rank, "--distributed-no-spawn"]
    cli_main()
