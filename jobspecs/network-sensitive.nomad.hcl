# A managed network-sensitive distributed job: four workers that slow down
# four times when they span racks (hadar.sensitivity). hadar's delay
# scheduling waits a while for GPUs within one rack, or one node, rather than
# spread it (docs/placement.md).
#
# ResNet-18 (batch size 16) on four GPUs: 124 steps/s on four V100s of one
# node, 41 spread over nodes (Gavel's measurements); the emulate block keeps
# those paces on a GPU-less machine (it cannot tell racks apart: over
# several nodes a unit runs at the spread pace).
#
#   nomad job run -var trainer=$PWD/bin/hadar-trainer jobspecs/network-sensitive.nomad.hcl

variable "trainer" {
  type        = string
  description = "Path of the hadar-trainer binary on the client nodes."
  default     = "/usr/local/bin/hadar-trainer"
}

variable "steps" {
  type        = number
  description = "Training steps of the job (of the whole job, not per worker)."
  default     = 12000
}

job "network-sensitive" {
  type = "batch"

  meta = {
    "hadar.model"       = "ResNet-18 (batch size 16)"
    "hadar.steps"       = "${var.steps}"
    "hadar.workers"     = "4"
    "hadar.sensitivity" = "4"
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
      kill_timeout = "15s"

      config {
        command     = var.trainer
        args        = ["--model", "mlp", "--progress-interval", "1s"]
        total_steps = var.steps

        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 123.85
            "Tesla P100-PCIE-16GB" = 94.32
            "Tesla K80"            = 16.12
          }
          spread_steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 40.59
            "Tesla P100-PCIE-16GB" = 55.9
            "Tesla K80"            = 17.08
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
