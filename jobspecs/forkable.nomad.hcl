# A managed forkable job (HadarE): when GPUs sit idle, the hadare policy
# forks the job into copies on other nodes; the copies train concurrently
# and merge their parameters through the hadar-train plugin's merge_root (a
# directory every node reaches), and are stopped again, after their last
# merge, when other jobs need the GPUs. Its progress is the sum of its
# copies' steps (docs/policies.md, "HadarE").
#
# Run the sidecar with policy = "hadare" for forks; under any other policy
# the job runs as one copy.
#
#   nomad job run -var trainer=$PWD/bin/hadar-trainer jobspecs/forkable.nomad.hcl

variable "trainer" {
  type        = string
  description = "Path of the hadar-trainer binary on the client nodes."
  default     = "/usr/local/bin/hadar-trainer"
}

variable "steps" {
  type        = number
  description = "Training steps of the job, summed over its copies."
  default     = 2000
}

job "forkable" {
  type = "batch"

  meta = {
    "hadar.model"    = "Transformer (batch size 16)"
    "hadar.steps"    = "${var.steps}"
    "hadar.forkable" = "true"
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

        # Each copy's pace. No hadare block is needed: a copy the sidecar
        # placed merges through merge_root by itself.
        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 11.06
            "Tesla P100-PCIE-16GB" = 9.54
            "Tesla K80"            = 5.47
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
