# A parameterized GPU job: register it once, then start a run with
#
#   nomad job run -var trainer=$PWD/bin/hadar-trainer jobspecs/dispatch.nomad.hcl
#   nomad job dispatch -meta steps=500 dispatch
#
# Each dispatch is a child job (dispatch/dispatch-<time>-<id>) that runs
# with the steps given.
#
# Unmanaged: it carries no hadar.* meta, so Nomad places its children
# itself, at once, and hadar plans around the GPUs they hold. The sidecar's
# contract refuses parameterized jobs and the children they dispatch today
# (docs/jobspec.md, "Jobs launched by another": Nomad's API cannot rewrite a
# dispatched job). For a run hadar should schedule, submit a job of its
# own (single-gpu.nomad.hcl with -var steps=500).

variable "trainer" {
  type        = string
  description = "Path of the hadar-trainer binary on the client nodes."
  default     = "/usr/local/bin/hadar-trainer"
}

job "dispatch" {
  type = "batch"

  parameterized {
    payload       = "forbidden"
    meta_required = ["steps"]
  }

  group "train" {
    task "trainer" {
      driver = "hadar-train"

      config {
        command = var.trainer
        # The dispatch's meta, as NOMAD_META_<key>.
        args = ["--model", "mlp", "--progress-interval", "1s", "--steps", "${NOMAD_META_steps}"]

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
