# A managed single-GPU training job: hadar decides which GPU type and node
# it runs on, and when (docs/jobspec.md is the contract).
#
# hadar.model names a job type of the throughput profile (Gavel's
# measurements, embedded in hadar): the planner knows from it that this
# ResNet-50 runs 11.4 steps/s on a V100, 9.05 on a P100 and 2.3 on a K80.
# The emulate block makes a GPU-less machine keep exactly those paces
# (docs/driver.md, "Emulating a heterogeneous cluster"); on real GPUs, drop
# it. e2e/jobspecs_test.go checks the paces against the profile.
#
#   nomad job run -var trainer=$PWD/bin/hadar-trainer jobspecs/single-gpu.nomad.hcl

variable "trainer" {
  type        = string
  description = "Path of the hadar-trainer binary on the client nodes."
  default     = "/usr/local/bin/hadar-trainer"
}

variable "steps" {
  type        = number
  description = "Training steps of the job."
  default     = 600
}

variable "model" {
  type        = string
  description = "Job type of the throughput profile (hadar.model)."
  default     = "ResNet-50 (batch size 16)"
}

variable "paces" {
  type        = map(number)
  description = "Emulated steps/s of the job on each GPU model: the profile's figures for var.model."
  default = {
    "Tesla V100-SXM2-16GB" = 11.4
    "Tesla P100-PCIE-16GB" = 9.05
    "Tesla K80"            = 2.3
  }
}

job "single-gpu" {
  type = "batch"

  meta = {
    "hadar.model" = var.model
    "hadar.steps" = "${var.steps}"
  }

  # Keeps the job pending until hadar places it. Never remove it yourself.
  constraint {
    attribute = "${meta.hadar.gate}"
    value     = "waiting-for-hadar"
  }

  group "train" {
    # hadar restarts a failed worker from its checkpoint itself; Nomad
    # must not restart or reschedule behind its back.
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }

    task "trainer" {
      driver = "hadar-train"
      # Time to write a checkpoint when hadar preempts the job.
      kill_timeout = "15s"

      config {
        command     = var.trainer
        args        = ["--model", "mlp", "--progress-interval", "1s"]
        total_steps = var.steps

        # The driver reads steps_per_sec as a list of maps, which a map
        # written out in place becomes by itself; a map variable is put
        # in a list.
        emulate {
          steps_per_sec = [var.paces]
        }
      }

      resources {
        cpu    = 100
        memory = 128

        # One GPU per worker; ask for more with hadar.workers.
        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
