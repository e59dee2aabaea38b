# Prometheus as a Nomad job that finds the hadar sidecar's replicas through
# Nomad's service registrations and scrapes their /metrics
# (docs/observability.md). The token it sends is not in this file: Nomad
# renders it from the job's Nomad Variable into the task's secrets, and
# Prometheus reads it from there (credentials_file) for every request.
#
#   nomad acl policy apply -description "Prometheus: hadar's metrics" prometheus docs/acl/prometheus.nomad.hcl
#   nomad acl token create -name prometheus -policy prometheus -type client
#   nomad var put nomad/jobs/prometheus hadar_token=<the token's Secret ID>
#   nomad job run deploy/prometheus/prometheus.nomad.hcl
#
# The job reads its own variable (nomad/jobs/<job>) and its namespace's
# services with its workload identity, no policy needed; put the variable
# before running the job (the task waits for it). A new token: `nomad var
# put -force ...` again; Nomad renders it, Prometheus reads it at its next
# scrape.

variable "namespace" {
  description = "The namespace of this job and of its variable nomad/jobs/prometheus."
  type        = string
  default     = "default"
}

variable "datacenters" {
  type    = list(string)
  default = ["*"]
}

variable "prometheus_binary" {
  description = "Path of the prometheus binary on the clients (raw_exec runs it as it is)."
  type        = string
  default     = "/usr/bin/prometheus"
}

variable "user" {
  description = "The user Prometheus runs as, and uid/gid: its token file is theirs alone."
  type        = string
  default     = "nobody"
}

variable "uid" {
  type    = number
  default = 65534
}

variable "gid" {
  type    = number
  default = 65534
}

variable "sidecar_service" {
  description = "The sidecar's Nomad service, in this job's namespace (run both jobs in one namespace)."
  type        = string
  default     = "hadar-sidecar"
}

variable "scrape_interval" {
  type    = string
  default = "15s"
}

variable "scheme" {
  description = "https where the sidecar's status API has TLS (status_tls_cert)."
  type        = string
  default     = "http"
}

variable "rule_files" {
  description = "Alert rule files on the clients, e.g. [\"/etc/prometheus/hadar-alerts.yml\"] (deploy/prometheus/hadar-alerts.yml)."
  type        = list(string)
  default     = []
}

job "prometheus" {
  namespace   = var.namespace
  type        = "service"
  datacenters = var.datacenters

  group "prometheus" {
    network {
      port "http" {}
    }

    service {
      provider = "nomad"
      name     = "prometheus"
      port     = "http"

      check {
        type     = "http"
        path     = "/-/ready"
        interval = "10s"
        timeout  = "3s"
      }
    }

    task "prometheus" {
      driver = "raw_exec"
      user   = var.user

      config {
        command = var.prometheus_binary
        args = [
          "--config.file=local/prometheus.yml",
          "--storage.tsdb.path=${NOMAD_ALLOC_DIR}/data/prometheus",
          "--web.listen-address=${NOMAD_ADDR_http}",
        ]
      }

      # The token: from the Variable, into the secrets directory, readable
      # by the task's user alone. Never in the jobspec, the job Nomad
      # stores, the environment or prometheus.yml.
      template {
        destination = "secrets/hadar-token"
        perms       = "0400"
        uid         = var.uid
        gid         = var.gid
        change_mode = "noop"
        data        = <<-EOT
        {{- with nomadVar "nomad/jobs/prometheus" }}{{ .hadar_token }}{{ end -}}
        EOT
      }

      # The replicas' addresses, from Nomad's service registrations:
      # Nomad renders the file again whenever they change, and Prometheus
      # reads it again (file_sd). Any Prometheus build has file_sd;
      # Debian's has no nomad_sd_configs (docs/observability.md has that
      # variant for builds that do).
      template {
        destination = "local/hadar-targets.json"
        change_mode = "noop"
        data        = <<-EOT
        [{{ range $i, $s := nomadService "${var.sidecar_service}" }}{{ if $i }},{{ end }}
          {"targets": ["{{ .Address }}:{{ .Port }}"], "labels": {"alloc_id": "{{ .AllocID }}"}}{{ end }}
        ]
        EOT
      }

      template {
        destination = "local/prometheus.yml"
        change_mode = "restart"
        data        = <<-EOT
        # Rendered by Nomad from deploy/prometheus/prometheus.nomad.hcl.
        global:
          scrape_interval: ${var.scrape_interval}
        rule_files: ${jsonencode(var.rule_files)}
        scrape_configs:
          # Every replica: each serves the whole cluster's view and
          # hadar_leader tells the leader; a dead leader must not take the
          # followers' metrics (and HadarNoLeader) with it.
          - job_name: hadar
            scheme: ${var.scheme}
            authorization:
              credentials_file: {{ env "NOMAD_SECRETS_DIR" }}/hadar-token
            file_sd_configs:
              - files: ["{{ env "NOMAD_TASK_DIR" }}/hadar-targets.json"]
                refresh_interval: 30s
        EOT
      }

      resources {
        cpu    = 500
        memory = 512
      }
    }
  }
}
