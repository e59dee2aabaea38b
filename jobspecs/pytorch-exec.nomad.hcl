# A PyTorch DDP job on Nomad's own exec driver: two workers, one GPU each,
# started together (hadar.gang, the default for more than one worker). The
# script is the Python library's DDP example (python/hadar_train): it joins
# its unit through the environment the sidecar writes (torchrun's variables:
# one process per GPU, LOCAL_RANK 0), stops with the unit on SIGTERM with a
# checkpoint from rank 0, and resumes from it (docs/pytorch.md).
#
# On exec the sidecar also gives each worker what hadar-train would: the
# job's ID, the progress file in its task directory, and its checkpoint
# directory on the client host volume "hadar-checkpoints", which it mounts
# at /hadar/checkpoints, when the sidecar's config has a storage block
# (without it, in the allocation; docs/training-contract.md, "Where things
# are").
# The clients need Debian's python3-torch (or torch from pip) and the
# library (pip install ./python), and a minimal chroot_env in their client
# configuration (docs/pytorch.md, "Jobspecs"): Nomad's default copies all
# of /usr (several times over where /lib and /bin link into it, about
# 280,000 files), which takes about a round and gets the job preempted
# before it starts. A script of your own goes in a host directory listed
# in chroot_env (args = ["-m", "hadar_train.run", "/srv/training/train.py"]),
# an installed package (-m), or an artifact fetched into local/.
#
#   nomad job run jobspecs/pytorch-exec.nomad.hcl

variable "python" {
  type        = string
  description = "The Python interpreter with torch and hadar_train on the client nodes."
  default     = "/usr/bin/python3"
}

variable "steps" {
  type        = number
  description = "Training steps of the job (of the whole job, not per worker)."
  default     = 2000
}

job "pytorch-exec" {
  type = "batch"

  meta = {
    "hadar.throughput" = "v100=40,p100=20,k80=10"
    "hadar.steps"      = "${var.steps}"
    "hadar.workers"    = "2"
  }

  constraint {
    attribute = "${meta.hadar.gate}"
    value     = "waiting-for-hadar"
  }

  # The template: hadar runs it as one generated group per worker.
  group "train" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }

    task "trainer" {
      driver = "exec"

      config {
        command = var.python
        # The library's launcher (python -m hadar_train.run SCRIPT or -m
        # MODULE) takes SIGTERM before the script imports torch: on exec
        # the task is PID 1 of its PID namespace, where a stop that comes
        # before the script's own handler would be dropped.
        args = ["-m", "hadar_train.run", "-m", "hadar_train.examples.ddp", "--checkpoint-every", "500"]
      }

      env {
        OMP_NUM_THREADS = "1"
      }

      resources {
        cpu    = 500
        memory = 2048

        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
