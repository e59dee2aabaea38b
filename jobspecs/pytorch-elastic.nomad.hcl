# An elastic PyTorch job (issue 35): it may run at 1 to 4 workers, one GPU
# each, with a fixed global batch of 48 samples a step at every width
# (48 divides among 1, 2, 3 and 4 workers: the library checks it against
# HADAR_WIDTHS, which the sidecar sets from hadar.workers on each worker).
# A policy that resizes (sia, hadar) chooses its width each round; the
# sidecar stops the workers with a checkpoint and writes the job again at
# the new width, and the library resumes at the new WORLD_SIZE with the
# same samples each step (docs/pytorch.md, "Elastic jobs"; docs/jobspec.md,
# "Elastic jobs"). An elastic job is a gang: its workers start together.
#
# The emulate block keeps each GPU model's pace on a machine without GPUs;
# on real GPUs, drop it.
#
#   nomad job run -var pythonpath=$PWD/python jobspecs/pytorch-elastic.nomad.hcl

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
  description = "Training steps of the job: global batches, the same at any width."
  default     = 3000
}

job "pytorch-elastic" {
  type = "batch"

  meta = {
    # The widths it may run at: a range, or an ascending list ("1,2,4").
    # It starts at the smallest. The workers get them as HADAR_WIDTHS.
    "hadar.workers" = "1-4"
    "hadar.model"   = "ResNet-50 (batch size 16)"
    "hadar.steps"   = "${var.steps}"
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
        command = var.python
        # The sidecar passes hadar.workers to every worker as HADAR_WIDTHS
        # ("1,2,3,4"): run.batch_plan checks the global batch divides among
        # every width before the first step (--widths would override it).
        args        = ["-m", "hadar_train.run", "-m", "hadar_train.examples.elastic", "--global-batch", "48"]
        total_steps = var.steps

        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 8
            "Tesla P100-PCIE-16GB" = 5
            "Tesla K80"            = 2
          }
        }
      }

      env {
        OMP_NUM_THREADS = "1"
        PYTHONPATH      = var.pythonpath
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
