# A managed job the throughput profile does not know: it declares its own
# steps/s per GPU type (hadar.throughput, the planner's type names), and
# runs only on the types it names. Measure them once (e.g. a few hundred
# steps on each type) and hadar plans with them; with learn = true the
# sidecar corrects them from the progress the job reports.
#
#   nomad job run -var trainer=$PWD/bin/hadar-trainer jobspecs/throughput.nomad.hcl

variable "trainer" {
  type        = string
  description = "Path of the hadar-trainer binary on the client nodes."
  default     = "/usr/local/bin/hadar-trainer"
}

variable "steps" {
  type        = number
  description = "Training steps of the job."
  default     = 2400
}

job "throughput" {
  type = "batch"

  meta = {
    "hadar.throughput" = "v100=40,p100=20,k80=10"
    "hadar.steps"      = "${var.steps}"
    "hadar.weight"     = "2"
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

        # The same figures by GPU model, for the emulation.
        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 40
            "Tesla P100-PCIE-16GB" = 20
            "Tesla K80"            = 10
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
