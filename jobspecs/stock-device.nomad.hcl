# A job as written for stock Nomad and its nvidia device plugin: no hadar
# meta, no gate, only Nomad's own device syntax (a device "nvidia/gpu"
# request with constraints on ${device.model} and ${device.attr.memory}).
# hadar-gpu answers it as Nomad's nvidia plugin would, and the hadar
# sidecar never touches it: Nomad places it at once, and hadar plans the
# other jobs around the GPU it holds.
#
#   nomad job run -var trainer=$PWD/bin/hadar-trainer jobspecs/stock-device.nomad.hcl

variable "trainer" {
  type        = string
  description = "Path of the hadar-trainer binary on the client nodes."
  default     = "/usr/local/bin/hadar-trainer"
}

variable "steps" {
  type        = number
  description = "Training steps of the job."
  default     = 1500
}

variable "gpu_model" {
  type        = string
  description = "GPU model the job asks for, as the device plugin names it."
  default     = "Tesla K80"
}

job "stock-device" {
  type = "batch"

  group "train" {
    task "trainer" {
      driver = "hadar-train"

      config {
        command     = var.trainer
        args        = ["--model", "mlp", "--progress-interval", "1s"]
        total_steps = var.steps

        # Emulation only (a machine without GPUs): drop on real GPUs.
        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 20
            "Tesla P100-PCIE-16GB" = 15
            "Tesla K80"            = 10
          }
        }
      }

      resources {
        cpu    = 100
        memory = 128

        device "nvidia/gpu" {
          count = 1

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
