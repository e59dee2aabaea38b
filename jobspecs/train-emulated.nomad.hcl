# A training job for hadar's task driver on two GPUs of one model.
# e2e/plugins_test.go runs this file against a real Nomad agent whose
# hadar-gpu plugin declares a mixed inventory (see docs/driver.md), so it
# is kept working. On a node with real GPUs, drop the emulate block.

variable "trainer" {
  type        = string
  description = "Path of the hadar-trainer binary on the client nodes."
  default     = "/usr/local/bin/hadar-trainer"
}

variable "gpu_model" {
  type        = string
  description = "GPU model to run on, as hadar-gpu reports it."
  default     = "Tesla V100-SXM2-16GB"
}

job "train-emulated" {
  type = "batch"

  group "train" {
    # A stopped or failed run is resumed by running the job again, from
    # the checkpoint the driver keeps under its checkpoint_root.
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
      # Time the trainer gets to write a checkpoint after SIGTERM.
      kill_timeout = "20s"

      config {
        command     = var.trainer
        args        = ["--model", "mlp", "--progress-interval", "1s"]
        total_steps = 100000

        # Emulated pace: steps/s of this job on each GPU model.
        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 40
            "Tesla K80"            = 12
          }
        }
      }

      resources {
        cpu    = 300
        memory = 256

        device "nvidia/gpu" {
          count = 2

          constraint {
            attribute = "${device.model}"
            value     = var.gpu_model
          }

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "12 GiB"
          }
        }
      }
    }
  }
}
