# Rendered from the hadar pack (deploy/pack/hadar, docs/deploy.md): the
# job of deploy/hadar-sidecar.nomad.hcl with the pack's variables.
job "[[ template "job_name" . ]]" {
  namespace   = [[ var "namespace" . | quote ]]
  type        = "service"
  datacenters = [[ var "datacenters" . | toJson ]]
  node_pool   = [[ var "node_pool" . | quote ]]

  group "sidecar" {
    count = [[ var "count" . ]]

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
        name            = "hadar health"
        type            = "http"
        protocol        = [[ if eq (var "status_tls_cert" .) "" ]]"http"[[ else ]]"https"[[ end ]]
        path            = "/v1/health"
        interval        = "10s"
        timeout         = "3s"
        tls_skip_verify = true
      }
    }

    # Every replica registers it; only the leader passes its check.
    service {
      provider = "nomad"
      name     = "hadar-leader"
      port     = "http"
      tags     = ["hadar", "leader"]

      check {
        name            = "hadar leader"
        type            = "http"
        protocol        = [[ if eq (var "status_tls_cert" .) "" ]]"http"[[ else ]]"https"[[ end ]]
        path            = "/v1/leader"
        interval        = "5s"
        timeout         = "3s"
        on_update       = "ignore"
        tls_skip_verify = true
      }
    }

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
      user   = [[ var "user" . | quote ]]
[[- if ne (var "hadar_artifact" .) "" ]]

      artifact {
        source      = [[ var "hadar_artifact" . | quote ]]
        destination = "local/hadar-release"
      }

      config {
        command = "local/hadar-release/hadar"
        args    = ["sidecar", "-config", "local/sidecar.hcl"]
      }
[[- else ]]

      config {
        command = [[ var "hadar_binary" . | quote ]]
        args    = ["sidecar", "-config", "local/sidecar.hcl"]
      }
[[- end ]]

      identity {
        name        = "hadar"
        aud         = ["nomadproject.io"]
        ttl         = [[ var "identity_ttl" . | quote ]]
        file        = true
        change_mode = "noop"
      }

      kill_signal  = "SIGINT"
      kill_timeout = "30s"

      env {
        NOMAD_ADDR   = [[ if ne (var "nomad_address" .) "" ]][[ var "nomad_address" . | quote ]][[ else ]]"http://${attr.unique.advertise.address}"[[ end ]]
        NOMAD_CACERT = [[ var "nomad_ca_cert" . | quote ]]
      }

      template {
        destination = "local/sidecar.hcl"
        change_mode = "restart"
        data        = <<-EOT
        nomad {
          token_file = "{{ env "NOMAD_SECRETS_DIR" }}/nomad_hadar.jwt"
[[- if ne (var "auth_method" .) "" ]]
          auth_method = [[ var "auth_method" . | quote ]]
[[- end ]]
        }
        namespaces = [[ var "watch_namespaces" . | toJson ]]
        policy     = [[ var "policy" . | quote ]]
        round      = [[ var "round" . | quote ]]
        leader {
          enabled    = true
          ttl        = [[ var "lock_ttl" . | quote ]]
          lock_delay = [[ var "lock_delay" . | quote ]]
          namespace  = [[ var "state_namespace" . | quote ]]
        }
        state {
          store     = "nomad"
          namespace = [[ var "state_namespace" . | quote ]]
        }
        http {
          address    = "{{ env "NOMAD_ADDR_http" }}"
          nomad_auth = [[ var "status_nomad_auth" . ]]
[[- if ne (var "status_tls_cert" .) "" ]]
          tls_cert   = [[ var "status_tls_cert" . | quote ]]
          tls_key    = [[ var "status_tls_key" . | quote ]]
[[- else ]]
          allow_insecure_http = true
[[- end ]]
        }
[[ var "queues" . | indent 8 ]]
[[ var "extra_config" . | indent 8 ]]
        EOT
      }

      resources {
        cpu        = 500
        memory     = 256
        memory_max = 512
      }
    }
  }
}
