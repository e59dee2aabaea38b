# A managed distributed job: two workers, one GPU each, started together or
# not at all (hadar.gang, the default for more than one worker). Nomad has no
# gang scheduling; the hadar sidecar gives it (docs/sidecar.md, "Gangs") and
# writes torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT into each
# worker's environment, so a PyTorch DDP script runs unchanged.
#
# LM (batch size 20) on two GPUs: 132 steps/s on two V100s of one node, 30
# when they sit on two nodes (Gavel's measurements): the planner keeps the
# pair together. The emulate block keeps those paces on a GPU-less machine.
#
#   nomad job run -var trainer=$PWD/bin/hadar-trainer jobspecs/gang.nomad.hcl

variable "trainer" {
  type        = string
  description = "Path of the hadar-trainer binary on the client nodes."
  default     = "/usr/local/bin/hadar-trainer"
}

variable "steps" {
  type        = number
  description = "Training steps of the job (of the whole job, not per worker)."
  default     = 8000
}

job "gang" {
  type = "batch"

  meta = {
    "hadar.model"   = "LM (batch size 20)"
    "hadar.steps"   = "${var.steps}"
    "hadar.workers" = "2"
    "hadar.gang"    = "true"
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
      driver       = "hadar-train"
      kill_timeout = "15s"

      config {
        command     = var.trainer
        args        = ["--model", "mlp", "--progress-interval", "1s"]
        total_steps = var.steps

        # Steps/s of the whole job on each model: with the workers on one
        # node, and spread over several.
        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 132.17
            "Tesla P100-PCIE-16GB" = 62.33
            "Tesla K80"            = 23.77
          }
          spread_steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 30.44
            "Tesla P100-PCIE-16GB" = 32.86
            "Tesla K80"            = 16.93
          }
        }
      }

      resources {
        cpu    = 100
        memory = 128

        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
