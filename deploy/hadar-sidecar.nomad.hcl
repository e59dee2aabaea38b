# The hadar sidecar as a Nomad service job (docs/deploy.md): two replicas
# on two nodes, one leading through a Nomad Variables lock, the state in
# Nomad Variables, authenticated by the task's workload identity (no token
# to hand out or rotate), its status API checked by Nomad on /v1/health,
# the leader's address found through the hadar-leader service's check.
#
#   nomad namespace apply training                          # where the managed jobs run
#   nomad acl policy apply -namespace default -job hadar-sidecar \
#     -description "hadar sidecar" hadar-sidecar docs/acl/hadar-sidecar.nomad.hcl
#   nomad acl auth-method create -name hadar-workload -type JWT -max-token-ttl 1h \
#     -token-locality local -config @deploy/hadar-auth-method.json
#   hadar auth-method -fix    # the JWKS URL: this cluster's ($NOMAD_ADDR), not 127.0.0.1:4646
#   nomad acl binding-rule create -auth-method hadar-workload -bind-type policy -bind-name hadar-sidecar \
#     -selector 'value.nomad_namespace == "default" and value.nomad_job_id == "hadar-sidecar"'
#   nomad job run -var hadar_binary=/usr/local/bin/hadar deploy/hadar-sidecar.nomad.hcl
#
# The binary: install the release's `hadar` at hadar_binary on every
# client that may run the sidecar (make dist builds the archives), or set
# hadar_artifact to an http(s) URL of the release archive (with its
# ?checksum=sha256:... from SHA256SUMS) that the clients can fetch.

variable "namespace" {
  description = "The namespace the sidecar job runs in (the -namespace of `nomad acl policy apply -job`)."
  type        = string
  default     = "default"
}

variable "datacenters" {
  type    = list(string)
  default = ["*"]
}

variable "node_pool" {
  type    = string
  default = "default"
}

variable "count" {
  description = "Replicas; one leads, the others follow. A leader stopped by Nomad releases the lock: another leads within about 2 s. One that dies (SIGKILL, a lost node) is replaced about 2 x lock_ttl + lock_delay later."
  type        = number
  default     = 2
}

variable "hadar_binary" {
  description = "Path of the hadar binary on the clients (raw_exec runs it as it is)."
  type        = string
  default     = "/usr/local/bin/hadar"
}

variable "hadar_artifact" {
  description = "Instead of hadar_binary: a URL of the release archive (hadar_<version>_linux_<arch>.tar.gz) for Nomad to fetch, with ?checksum=sha256:<hex>. Empty: use hadar_binary."
  type        = string
  default     = ""
}

variable "nomad_address" {
  description = "Nomad's HTTP API as the sidecar reaches it. Empty: the HTTP API of the client agent the replica runs on (http://<its advertise address>), which forwards to the servers; give https://... with nomad_ca_cert where the API uses TLS."
  type        = string
  default     = ""
}

variable "nomad_ca_cert" {
  description = "CA bundle (a path on the clients) to verify Nomad's HTTPS API with; empty: none."
  type        = string
  default     = ""
}

variable "user" {
  description = "The user the sidecar runs as (raw_exec): it needs no privilege on the node."
  type        = string
  default     = "nobody"
}

variable "state_namespace" {
  description = "Namespace of the sidecar's Nomad Variables (state and leader lock): one whose variables the ACL policy lets it write."
  type        = string
  default     = "training"
}

variable "watch_namespaces" {
  description = "Namespaces whose managed jobs the sidecar plans."
  type        = list(string)
  default     = ["*"]
}

variable "policy" {
  type    = string
  default = "hadar"
}

variable "round" {
  type    = string
  default = "6m"
}

variable "lock_ttl" {
  type    = string
  default = "15s"
}

variable "lock_delay" {
  description = "How long Nomad keeps the leader lock from being taken again after its holder's lease lapsed (a released lock is free at once)."
  type        = string
  default     = "15s"
}

variable "status_tls_cert" {
  description = "PEM certificate (a path on the clients) for HTTPS on the status API; empty: plain HTTP on the node's address, callers authenticated with Nomad ACL tokens."
  type        = string
  default     = ""
}

variable "status_tls_key" {
  type    = string
  default = ""
}

variable "extra_config" {
  description = "More sidecar configuration (HCL, docs/sidecar.md), appended as it is: gpu_types, placement, min_run_time, ..."
  type        = string
  default     = ""
}

variable "auth_method" {
  description = "The Nomad JWT auth method the sidecar logs in to with its workload identity, for an ACL token (deploy/hadar-auth-method.json; Nomad up to 1.11.3 refuses a workload identity for planning a job). Empty: the identity itself is the token."
  type        = string
  default     = "hadar-workload"
}

variable "identity_ttl" {
  description = "Lifetime of the sidecar's workload identity token; Nomad renews it at about half of it, and the sidecar reads each renewal from its secrets."
  type        = string
  default     = "1h"
}

job "hadar-sidecar" {
  namespace   = var.namespace
  type        = "service"
  datacenters = var.datacenters
  node_pool   = var.node_pool

  group "sidecar" {
    count = var.count

    # Two replicas on one node would fail together.
    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    network {
      port "http" {}
    }

    service {
      provider = "nomad"
      name     = "hadar-sidecar"
      port     = "http"
      tags     = ["hadar"]

      check {
        name     = "hadar health"
        type     = "http"
        protocol = var.status_tls_cert == "" ? "http" : "https"
        path     = "/v1/health"
        interval = "10s"
        timeout  = "3s"
        # tls_skip_verify: the check runs from the client agent, which
        # does not hold the status API's CA.
        tls_skip_verify = true
      }
    }

    # The leader's address: every replica registers hadar-leader, and only
    # the acting one passes its check. Nomad's service API lists every
    # registration whatever its checks (Nomad keeps check results on the
    # clients), so the leader is the registration whose allocation's
    # "hadar leader" check passes (docs/deploy.md, "The leader's address").
    service {
      provider = "nomad"
      name     = "hadar-leader"
      port     = "http"
      tags     = ["hadar", "leader"]

      check {
        name     = "hadar leader"
        type     = "http"
        protocol = var.status_tls_cert == "" ? "http" : "https"
        path     = "/v1/leader"
        interval = "5s"
        timeout  = "3s"
        # A follower fails it by design: deployments wait on "hadar
        # health" alone.
        on_update       = "ignore"
        tls_skip_verify = true
      }
    }

    # A replica that crashed is restarted in place first; the other one
    # leads meanwhile.
    restart {
      attempts = 10
      interval = "10m"
      delay    = "10s"
      mode     = "delay"
    }

    update {
      max_parallel     = 1
      health_check     = "checks"
      min_healthy_time = "10s"
      healthy_deadline = "5m"
    }

    task "hadar" {
      driver = "raw_exec"
      user   = var.user

      dynamic "artifact" {
        for_each = var.hadar_artifact == "" ? [] : [var.hadar_artifact]
        content {
          source      = artifact.value
          destination = "local/hadar-release"
        }
      }

      config {
        command = var.hadar_artifact == "" ? var.hadar_binary : "local/hadar-release/hadar"
        args    = ["sidecar", "-config", "local/sidecar.hcl"]
      }

      # The workload identity the sidecar talks to Nomad with: a JWT in
      # secrets/nomad_hadar.jwt, renewed by Nomad at about half its TTL
      # and read again by the sidecar on every request. Nomad gives it the
      # ACL policy bound to this job (nomad acl policy apply -job).
      identity {
        name        = "hadar"
        aud         = ["nomadproject.io"]
        ttl         = var.identity_ttl
        file        = true
        change_mode = "noop"
      }

      # SIGINT: the sidecar stops its writes, saves its state and releases
      # the leader lock; another replica takes it at its next try, within
      # about 2 s (the graceful handover of TestSidecarFailover). Only a
      # leader that dies without releasing it (SIGKILL, a lost node) leaves
      # the lock to lapse: about 2 x lock_ttl + lock_delay (45 s with the
      # defaults). TestDeployedSidecar's 19 s, from stopping the leader's
      # allocation until two replicas are registered again with one
      # leading, includes the replacement allocation's start.
      kill_signal  = "SIGINT"
      kill_timeout = "30s"

      # Nomad's API: the local client agent's, by default. Not the Task
      # API's socket in the secrets directory: the sidecar holds a
      # streaming request open at all times, and a socket in use keeps
      # Nomad from unmounting the secrets directory when the allocation
      # is collected.
      env {
        NOMAD_ADDR   = var.nomad_address != "" ? var.nomad_address : "http://${attr.unique.advertise.address}"
        NOMAD_CACERT = var.nomad_ca_cert
      }

      template {
        destination = "local/sidecar.hcl"
        change_mode = "restart"
        data        = <<-EOT
        # Rendered by Nomad from deploy/hadar-sidecar.nomad.hcl.
        nomad {
          # The address: NOMAD_ADDR (the task's env).
          token_file = "{{ env "NOMAD_SECRETS_DIR" }}/nomad_hadar.jwt"
        %{~ if var.auth_method != "" }
          auth_method = "${var.auth_method}"
        %{~ endif }
        }
        namespaces = ${jsonencode(var.watch_namespaces)}
        policy     = "${var.policy}"
        round      = "${var.round}"
        leader {
          enabled   = true
          ttl        = "${var.lock_ttl}"
          lock_delay = "${var.lock_delay}"
          namespace = "${var.state_namespace}"
        }
        state {
          store     = "nomad"
          namespace = "${var.state_namespace}"
        }
        http {
          address    = "{{ env "NOMAD_ADDR_http" }}"
          nomad_auth = true
        %{~ if var.status_tls_cert != "" }
          tls_cert   = "${var.status_tls_cert}"
          tls_key    = "${var.status_tls_key}"
        %{~ else }
          # Plain HTTP on the cluster's network, as Nomad's own API
          # without TLS: give status_tls_cert and status_tls_key to
          # encrypt it.
          allow_insecure_http = true
        %{~ endif }
        }
        ${var.extra_config}
        EOT
      }

      # Measured at 500 nodes and 1,000 jobs (docs/results.md, "Scale
      # against a real Nomad server"): 0.12 to 0.32 cores, peak RSS 80 to
      # 108 MiB.
      resources {
        cpu        = 500
        memory     = 256
        memory_max = 512
      }
    }
  }
}
