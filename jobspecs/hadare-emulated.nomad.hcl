# A HadarE job: two copies of one training job, each on one GPU of
# whatever model is free, merging parameters every 40 local steps through
# the hadar-train plugin's merge_root (a directory every copy can reach;
# a shared filesystem across nodes). e2e/plugins_test.go runs this file.

variable "trainer" {
  type        = string
  description = "Path of the hadar-trainer binary on the client nodes."
  default     = "/usr/local/bin/hadar-trainer"
}

job "hadare-emulated" {
  type = "batch"

  group "copies" {
    # One allocation per copy; NOMAD_ALLOC_INDEX is the copy index.
    count = 2

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
      kill_timeout = "20s"

      config {
        command     = var.trainer
        args        = ["--model", "mlp", "--progress-interval", "1s"]
        total_steps = 100000

        hadare {
          copies      = 2
          merge_every = 40
        }

        emulate {
          steps_per_sec = {
            "Tesla V100-SXM2-16GB" = 40
            "Tesla K80"            = 12
          }
        }
      }

      resources {
        cpu    = 200
        memory = 256

        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
