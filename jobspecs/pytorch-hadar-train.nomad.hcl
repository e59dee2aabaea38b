# A forkable PyTorch job (HadarE) on hadar's own task driver: the hadare
# policy forks it into copies on idle GPUs; each copy is the Python
# library's HadarE example (python/hadar_train), which merges its model
# with the others' through hadar-train's merge_root every round, weighted
# by their steps, and leaves its last steps when it is stopped
# (docs/training-contract.md, "HadarE membership and merge"). hadar-train
# runs each job as a uid of its own, confined to its directories under the
# operator's roots (docs/driver.md).
#
# The emulate block keeps each GPU model's pace on a machine without GPUs;
# on real GPUs, drop it.
#
#   nomad job run -var pythonpath=$PWD/python jobspecs/pytorch-hadar-train.nomad.hcl

variable "python" {
  type        = string
  description = "The Python interpreter with torch on the client nodes."
  default     = "/usr/bin/python3"
}

variable "pythonpath" {
  type        = string
  description = "Where hadar_train is, when it is not installed with pip."
  default     = ""
}

variable "steps" {
  type        = number
  description = "Training steps of the job, summed over its copies."
  default     = 6000
}

job "pytorch-hadar-train" {
  type = "batch"

  meta = {
    "hadar.throughput" = "v100=50,p100=30,k80=15"
    "hadar.steps"      = "${var.steps}"
    "hadar.forkable"   = "true"
  }

  constraint {
    attribute = "${meta.hadar.gate}"
    value     = "waiting-for-hadar"
  }

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
      driver       = "hadar-train"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        command     = var.python
        # The library's launcher takes SIGTERM before the script imports
        # torch (a stop then exits 0, not 143) and ends the process with
        # the contract's status (docs/pytorch.md).
        args        = ["-m", "hadar_train.run", "-m", "hadar_train.examples.hadare"]
        total_steps = var.steps

        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 50
            "Tesla P100-PCIE-16GB" = 30
            "Tesla K80"            = 15
          }
        }
      }

      env {
        OMP_NUM_THREADS = "1"
        PYTHONPATH      = var.pythonpath
        # Rounds of about 2 s whatever the GPU: each copy's steps per
        # round are its pace times this.
        HADAR_MERGE_INTERVAL = "2s"
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
